"""New run: presets, model facts and memory, dataset mapping and preview, and every TrainConfig knob.

No ``st.form``: the column mapping, the model panel and the memory estimate react as soon as a value
changes. Every widget reads and writes ``st.session_state`` under ``nr_<field>``, so a preset fills
the page by writing those keys, and the config is built from the state wherever it is needed. The
page stays cheap on each rerun: model facts and dataset columns are cached, and the data preview (a
tokenizer in a subprocess) runs only when asked for. Defaults come from ``TrainConfig()`` and help
texts from ``TrainConfig.help``; validation is the config's, every problem shown at once.
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from trainer_core import datasets, hardware, memory, model_info, parallel, presets, preview
from trainer_core.worker import engines
from trainer_core.config import (
    BUNDLED_DATASET,
    BUNDLED_MODEL,
    DEFAULT_TARGET_MODULES,
    FORMAT_TYPES,
    OPTIMIZERS,
    SCHEDULERS,
    SECRET_FIELDS,
    TRAINING_TYPES,
    ConfigError,
    FieldError,
    TrainConfig,
    looks_like_path,
)
from trainer_core.access import Action, allowed
from trainer_core.datasets import DatasetError, save_upload
from trainer_core.jobs.orchestrator import RunRefused
from trainer_core.protocol.status import RunStatus
from ui import format as fmt
from ui.auth import current_actor
from ui.entry import require_entrypoint
from ui.state import get_orchestrator
from ui.text import code, safe

require_entrypoint("pages/new_run.py")

D = TrainConfig()
H = TrainConfig.help
K = "nr_"  # widget-key prefix; secrets live only in their own widget's state
BASE = K + "base"  # the loaded preset: fields without a widget keep its values
SAVED = K + "saved"  # widget values kept while the user is on another page (Streamlit drops them)
UPLOADS = K + "uploads"  # upload file_id -> saved path, so an upload is hashed and written once
PREVIEW = K + "preview"  # (config key, Preview | list[FieldError]) of the last "Preview data"
MAP_AS = K + "map_as"  # the format whose role pickers were shown last

MODEL_SOURCES = {"bundled": "Bundled (SmolLM2-135M-Instruct)", "local": "Local folder", "hub": "Hugging Face hub id"}
DATASET_SOURCES = {"bundled": "Bundled demo", "upload": "Upload a file", "local": "Local file path",
                   "hub": "Hugging Face hub dataset"}
UPLOAD_TYPES = ["jsonl", "json", "csv", "parquet"]
EXTRA_MODULES = ["embed_tokens", "lm_head"]
MODULE_CHOICES = DEFAULT_TARGET_MODULES + EXTRA_MODULES
CHOICES = {"training_type": list(TRAINING_TYPES), "format_type": FORMAT_TYPES, "lr_scheduler_type": SCHEDULERS,
           "optim": OPTIMIZERS}  # fields shown as selectboxes
NOT_MAPPED = "—"
SAMPLE_ROWS = 100  # rows read for the mapping pickers and the format guess

# Fields whose widget holds exactly the config value, under the key nr_<field>.
PLAIN_FIELDS = (
    "run_name", "training_type", "max_seq_length", "load_in_4bit", "trust_remote_code", "hf_dataset", "format_type",
    "subset", "train_split", "eval_split", "eval_fraction", "eval_steps", "early_stopping_patience",
    "dataset_slice_start", "dataset_slice_end", "system_prompt", "num_epochs", "max_steps", "learning_rate",
    "embedding_learning_rate", "batch_size", "gradient_accumulation_steps", "warmup_steps", "warmup_ratio",
    "weight_decay", "max_grad_norm", "lr_scheduler_type", "optim", "random_seed", "packing", "train_on_completions",
    "gradient_checkpointing", "logging_steps", "save_steps", "resume_from_checkpoint", "allow_memory_overcommit",
    "use_lora", "lora_r",
    "lora_alpha", "lora_dropout", "use_rslora", "use_loftq", "finetune_attention_modules", "finetune_mlp_modules",
    "finetune_language_layers", "enable_wandb", "wandb_project", "enable_tensorboard", "tensorboard_dir",
    "num_processes",
)
STRIPPED_FIELDS = ("run_name", "hf_dataset", "subset", "train_split", "eval_split", "wandb_project",
                   "resume_from_checkpoint", "tensorboard_dir")
# Role pickers per format: (mapping key, label, required).
ROLE_SLOTS = {
    "alpaca": [("instruction", "Instruction column", True), ("input", "Input column (optional)", False),
               ("output", "Output column", True)],
    "chatml": [("messages", "Messages column", True), ("role", "Role key in each turn", False),
               ("content", "Content key in each turn", False)],
    "sharegpt": [("conversations", "Conversations column", True), ("from", "Speaker key in each turn", False),
                 ("value", "Text key in each turn", False)],
    "text": [("text", "Text column", True)],
}
TURN_SLOTS = {"chatml": ("messages", "role"), "sharegpt": ("conversations", "from")}  # where role names live
TURN_KEY_SLOTS = ("role", "content", "from", "value")  # pickers offering the keys inside each turn
ROLE_NAMES = ("user", "assistant", "system")
PREVIEW_FIELDS = ("model_name", "hf_dataset", "local_datasets", "local_eval_datasets", "subset", "train_split",
                  "eval_split", "format_type", "custom_format_mapping", "system_prompt", "max_seq_length",
                  "train_on_completions", "packing", "batch_size", "gradient_accumulation_steps", "eval_fraction",
                  "dataset_slice_start", "dataset_slice_end", "random_seed", "trust_remote_code", "training_type",
                  "num_processes", "gpu_ids")


# ---------------------------------------------------------------------- small parsers
def _split_list(text: str) -> list[str]:
    return [part.strip() for line in text.splitlines() for part in line.split(",") if part.strip()]


def parse_mapping(text: str) -> tuple[dict[str, str], list[FieldError]]:
    """``role=column`` lines (``role: column`` also works; ``#`` starts a comment) into a dict."""
    mapping: dict[str, str] = {}
    errors: list[FieldError] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        sep = "=" if "=" in line else ":"
        role, _, column = line.partition(sep)
        if not role.strip() or not column.strip():
            errors.append(FieldError("custom_format_mapping", f"line {number}: write role=column, got {line!r}"))
            continue
        mapping[role.strip()] = column.strip()
    return mapping, errors


def parse_gpu_ids(text: str) -> tuple[list[int], list[FieldError]]:
    try:
        return [int(part) for part in _split_list(text)], []
    except ValueError:
        return [], [FieldError("gpu_ids", f"write GPU numbers separated by commas, such as 0,1; got {text!r}")]


def model_name(source: str, text: str) -> str:
    text = text.strip()
    if source == "bundled":
        return BUNDLED_MODEL
    if source == "local" and text and not looks_like_path(text):
        return "./" + text  # a relative folder name must not be mistaken for a hub id
    return text


# ---------------------------------------------------------------------- config <-> widget state
def config_to_state(cfg: TrainConfig) -> dict[str, Any]:
    """The widget values that show ``cfg`` (secrets are left alone: they never come from a config)."""
    state = {K + name: getattr(cfg, name) for name in PLAIN_FIELDS}
    if cfg.model_name == BUNDLED_MODEL:
        state.update({K + "model_source": "bundled", K + "model_text": ""})
    else:
        source = "local" if looks_like_path(cfg.model_name) else "hub"
        state.update({K + "model_source": source, K + "model_text": cfg.model_name})
    if cfg.hf_dataset:
        source = "hub"
    elif cfg.local_datasets == [BUNDLED_DATASET] or not cfg.local_datasets:
        source = "bundled"
    else:
        source = "local"
    state[K + "dataset_source"] = source
    state[K + "local_datasets"] = ", ".join(cfg.local_datasets) if source == "local" else ""
    state[K + "local_eval_datasets"] = ", ".join(cfg.local_eval_datasets)
    state[K + "custom_format_mapping"] = "".join(f"{k}={v}\n" for k, v in cfg.custom_format_mapping.items())
    state[K + "target_modules"] = [m for m in cfg.target_modules if m in MODULE_CHOICES]
    state[K + "extra_modules"] = ", ".join(m for m in cfg.target_modules if m not in MODULE_CHOICES)
    state[K + "gpu_ids"] = ", ".join(str(g) for g in cfg.gpu_ids)
    return state


def init_state() -> None:
    """Widget values: kept ones first (after a visit to another page), else the loaded preset or defaults."""
    base = st.session_state.get(BASE) or TrainConfig()
    for key, value in {**config_to_state(base), **st.session_state.get(SAVED, {})}.items():
        st.session_state.setdefault(key, value)


def remember_state() -> None:
    keys = [K + "model_source", K + "model_text", K + "dataset_source", K + "local_datasets",
            K + "local_eval_datasets", K + "custom_format_mapping", K + "target_modules", K + "extra_modules",
            K + "gpu_ids", *(K + name for name in PLAIN_FIELDS)]
    keys += [key for key in st.session_state if str(key).startswith(K + "map_")]
    st.session_state[SAVED] = {key: st.session_state[key] for key in keys if key in st.session_state}


def apply_preset() -> None:
    """Button callback (runs before the widgets exist, so it may set their values)."""
    name = st.session_state.get(K + "preset_choice")
    try:
        cfg = presets.load_preset(name)
    except ConfigError as exc:
        st.session_state[K + "preset_message"] = ("error", exc.errors)
        return
    unknown = [FieldError(name, f"'{getattr(cfg, name)}' is not one of {', '.join(choices)}")
               for name, choices in CHOICES.items() if getattr(cfg, name) not in choices]
    if unknown:  # a selectbox cannot show a value outside its options
        st.session_state[K + "preset_message"] = ("error", unknown)
        return
    for key in [key for key in st.session_state if str(key).startswith(K + "map_")]:
        del st.session_state[key]  # the preset's mapping is shown in the text box; pickers start afresh
    st.session_state.pop(SAVED, None)
    st.session_state.update(config_to_state(cfg))
    st.session_state[BASE] = cfg
    st.session_state[K + "preset_message"] = ("success", f"Loaded preset '{name}'.")


def saved_upload(upload) -> tuple[list[str], list[FieldError]]:
    if upload is None:
        return [], [FieldError("local_datasets", "choose a file to upload (.jsonl, .json, .csv or .parquet)")]
    known = st.session_state.setdefault(UPLOADS, {})
    if upload.file_id not in known:
        try:
            known[upload.file_id] = str(save_upload(upload.name, upload))  # streamed: getvalue() would copy it
        except DatasetError as exc:
            return [], [FieldError(exc.field, exc.message)]
    return [known[upload.file_id]], []


def dataset_values(state) -> tuple[dict, list[FieldError]]:
    """``hf_dataset``/``local_datasets`` for the chosen source; an upload is saved under the data root."""
    source = state.get(K + "dataset_source", "bundled")
    hub_id = state.get(K + "hf_dataset", "").strip()
    if source == "bundled":
        return {"hf_dataset": "", "local_datasets": [BUNDLED_DATASET]}, []
    if source == "hub":
        errors = [] if hub_id else [FieldError("hf_dataset", "enter a hub dataset id such as org/name")]
        return {"hf_dataset": hub_id, "local_datasets": []}, errors
    if source == "local":
        files = _split_list(state.get(K + "local_datasets", ""))
        errors = [] if files else [FieldError("local_datasets", "enter the path of a .jsonl/.json/.csv/.parquet file")]
        return {"hf_dataset": "", "local_datasets": files}, errors
    files, errors = saved_upload(state.get(K + "upload"))
    return {"hf_dataset": "", "local_datasets": files}, errors


def role_mapping(state, fmt_name: str | None) -> dict[str, str]:
    """What the role pickers of ``fmt_name`` map (a column left at its own name or unset maps nothing)."""
    mapping = {}
    slots = [key for key, _, _ in ROLE_SLOTS.get(fmt_name, [])]
    slots += list(ROLE_NAMES) if fmt_name in TURN_SLOTS else []
    for key in slots:
        chosen = state.get(f"{K}map_{fmt_name}_{key}", NOT_MAPPED)
        if chosen not in (NOT_MAPPED, key, None):
            mapping[key] = chosen
    return mapping


def current_mapping(state) -> tuple[dict[str, str], list[FieldError]]:
    """Role pickers, then the free-text lines (which win where both name a role)."""
    typed, errors = parse_mapping(state.get(K + "custom_format_mapping", ""))
    return {**role_mapping(state, state.get(MAP_AS)), **typed}, errors


def build_config(with_secrets: bool = True) -> tuple[TrainConfig | None, list[FieldError]]:
    """The config the page shows, and every problem found while reading the widgets."""
    state = st.session_state
    values: dict[str, Any] = {name: state[K + name] for name in PLAIN_FIELDS}
    for name in STRIPPED_FIELDS:
        values[name] = values[name].strip()
    dataset, errors = dataset_values(state)
    mapping, mapping_errors = current_mapping(state)
    gpu_ids, gpu_errors = parse_gpu_ids(state.get(K + "gpu_ids", ""))
    errors = mapping_errors + errors + gpu_errors
    values.update(dataset)
    values.update(
        model_name=model_name(state[K + "model_source"], state.get(K + "model_text", "")),
        local_eval_datasets=_split_list(state.get(K + "local_eval_datasets", "")),
        custom_format_mapping=mapping,
        target_modules=list(dict.fromkeys(state[K + "target_modules"] + _split_list(state.get(K + "extra_modules", "")))),
        gpu_ids=gpu_ids,
    )
    if with_secrets:
        values.update({name: state.get(K + name, "").strip() for name in SECRET_FIELDS})
    base = (state.get(BASE) or D).to_public_dict()
    try:
        cfg = TrainConfig.from_dict({**base, **values})
    except ConfigError as exc:
        return None, errors + exc.errors
    return cfg, errors


def remote_code_errors(state) -> list[FieldError]:
    if state.get(K + "trust_remote_code") and not state.get(K + "trust_remote_code_confirm"):
        return [FieldError("trust_remote_code", "tick 'I have read this model's code and trust its author' to run "
                                                "code from the model's repository, or turn Trust remote code off")]
    return []


def show_errors(errors: list[FieldError], headline: str = "The run was not started") -> None:
    st.error(f"{headline}: {len(errors)} problem(s) to fix.", icon="🚫")
    for error in errors:
        st.error(f"**{safe(error.field)}**: {safe(error.message)}")


# ---------------------------------------------------------------------- presets
def presets_panel() -> None:
    with st.expander("Presets: load one, or save this page as one", icon="📋"):
        found = presets.list_presets()
        by_name = {p.name: p for p in found}
        load_col, save_col = st.columns(2)
        with load_col:
            choice = st.selectbox("Preset", list(by_name), key=K + "preset_choice",
                                  format_func=lambda n: f"{n} (built-in)" if by_name[n].builtin else n)
            if choice:
                st.caption(safe(by_name[choice].description) or "No description.")
            st.button("Load preset", key=K + "load_preset", on_click=apply_preset, icon="📂")
            message = st.session_state.pop(K + "preset_message", None)
            if message and message[0] == "success":
                st.success(safe(message[1]))
            elif message:
                show_errors(message[1], "The preset was not loaded")
        with save_col:
            name = st.text_input("Save as", key=K + "preset_name", placeholder="my-preset (letters, digits, - _ .)")
            description = st.text_input("Description", key=K + "preset_description")
            overwrite = st.checkbox("Overwrite a preset of the same name", key=K + "preset_overwrite")
            if st.button("Save preset", key=K + "save_preset", icon="💾"):
                save_current(name, description, overwrite)
            saved = st.session_state.pop(K + "save_message", None)
            if saved:
                st.success(safe(saved))


def save_current(name: str, description: str, overwrite: bool) -> None:
    cfg, errors = build_config(with_secrets=False)
    if cfg is None or errors:
        show_errors(errors, "The preset was not saved")
        return
    try:
        path = presets.save_preset(name, cfg, description=description, overwrite=overwrite)
    except ConfigError as exc:
        show_errors(exc.errors, "The preset was not saved")
        return
    st.session_state[K + "save_message"] = f"Saved preset '{path.stem}' to {path} (without tokens)."
    st.rerun()  # so the preset list above offers it at once


# ---------------------------------------------------------------------- model facts and memory
@st.cache_data(ttl=600, max_entries=32, show_spinner="Reading the model's configuration…")
def inspect_cached(name: str, _token: str | None = None) -> tuple[model_info.ModelInfo | None, str]:
    """(info, "") or (None, what to do). Failures are cached too, so an offline hub id is not retried per rerun."""
    try:
        return model_info.inspect_model(name, token=_token), ""
    except model_info.ModelInfoError as exc:
        return None, exc.message


def model_panel(name: str) -> model_info.ModelInfo | None:
    if not name:
        st.caption("Enter a local folder or a hub id to see the model's size and memory needs.")
        return None
    info, problem = inspect_cached(name, st.session_state.get(K + "hf_token", "").strip() or None)
    if info is None:
        st.warning(f"**model_name**: {safe(problem)}", icon="🔎")
        return None
    cols = st.columns(4)
    cols[0].metric("Architecture", info.architecture, help=f"model_type: {info.model_type}")
    cols[1].metric("Parameters", fmt.compact(info.num_parameters), help=f"{info.num_parameters:,}")
    cols[2].metric("Chat template", "yes" if info.has_chat_template else "no",
                   help="Chat formats use the model's own template; without one a plain fallback is used.")
    context = f"{info.max_position_embeddings:,}" if info.max_position_embeddings else "—"
    cols[3].metric("Context", context, help="max_position_embeddings")
    st.caption(f"{info.num_layers} layers · hidden {info.hidden_size} · {info.num_attention_heads} heads "
               f"({info.num_kv_heads} KV) · vocab {info.vocab_size:,} · {safe(info.torch_dtype)} · read from "
               f"{safe(info.source)}")
    if info.max_position_embeddings and st.session_state[K + "max_seq_length"] > info.max_position_embeddings:
        st.warning(f"**max_seq_length** is above the model's context of {context} tokens: lower it.")
    return info


def memory_panel(info: model_info.ModelInfo | None, cfg: TrainConfig | None) -> None:
    st.subheader("Memory")
    if info is None or cfg is None:
        st.caption("The estimate appears once the model can be read and the settings are valid numbers.")
        return
    if cfg.batch_size < 1 or cfg.max_seq_length < 1:
        st.caption("Set a batch size and a max sequence length of at least 1 to see the estimate.")
        return
    device = "cuda" if hardware.cuda_available() else "cpu"
    shown = current_preview(cfg)
    longest = max(shown.lengths) if shown is not None and shown.lengths else None
    processes = parallel.process_count(cfg)
    engine = engines.choose_engine(processes)
    est = memory.estimate_memory(info, cfg, device, longest_row=longest, engine=engine)
    dev = memory.device_memory(cfg)
    table_col, fit_col = st.columns([2, 3])
    table = pd.DataFrame([(part, f"{gb:.2f}") for part, gb in est.rows()], columns=["part", "GB"])
    table_col.dataframe(table, hide_index=True, width="stretch")
    free = f"{dev.free_gb:.1f} GB free of {dev.total_gb:.1f} GB" if math.isfinite(dev.free_gb) else "free memory unknown"
    fit_col.metric(f"Estimated need on {device.upper()}", f"{est.total_gb:.1f} GB", help=f"{dev.label}: {free}")
    sized = (f"sized from the longest row in the preview ({longest:,} tokens)" if longest and not cfg.packing
             else f"assuming rows of max_seq_length={cfg.max_seq_length}; Preview data sizes it from your data")
    fit_col.caption(f"{dev.label}: {free} · {est.trainable_params:,} trainable parameters · {sized} · "
                    f"{engine} engine, per process")
    fit_col.caption(f"{processes} data-parallel process(es): global batch {parallel.global_batch(cfg, processes):,} "
                    f"rows per step (batch {cfg.batch_size} × accumulation {cfg.gradient_accumulation_steps} × "
                    f"{processes})")
    level, text = memory.fit_message(est, dev, cfg, info, engine=engine)
    if level == "ok":
        fit_col.success(text, icon="✅")
    elif level == "tight":
        fit_col.warning(text, icon="⚠️")
    else:
        fit_col.error(text, icon="🧱")


# ---------------------------------------------------------------------- dataset columns and mapping
@st.cache_data(max_entries=16, show_spinner="Reading the dataset…")
def sample_rows(path: str, stamp: tuple[int, int]) -> tuple[list[dict], str]:
    """(first rows, "") or ([], problem). ``stamp`` (mtime, size) makes an edited file read again."""
    try:
        return datasets.read_rows(Path(path))[:SAMPLE_ROWS], ""
    except DatasetError as exc:
        return [], exc.message


def dataset_sample() -> tuple[list[dict], str, str]:
    """(rows, problem, which file) for the mapping pickers: the first local file; nothing for hub data."""
    dataset, _ = dataset_values(st.session_state)
    if not dataset["local_datasets"]:
        return [], "", ""
    try:
        path = datasets.resolve_source(dataset["local_datasets"][0])
    except DatasetError as exc:
        return [], exc.message, dataset["local_datasets"][0]
    stat = path.stat()
    rows, problem = sample_rows(str(path), (stat.st_mtime_ns, stat.st_size))
    return rows, problem, path.name


def columns_of(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(str(column) for row in rows for column in row))


def turn_values(rows: list[dict], column: str, key: str | None = None) -> list[str]:
    """The keys of the turns in a chat column, or (with ``key``) the distinct values under that key."""
    found: dict[str, None] = {}
    for row in rows:
        value = row.get(column)
        if isinstance(value, str) and value.lstrip().startswith("["):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                continue
        for turn in value if isinstance(value, list) else []:
            if isinstance(turn, dict):
                if key is None:
                    found.update(dict.fromkeys(str(k) for k in turn))
                elif isinstance(turn.get(key), str):
                    found[turn[key]] = None
    return list(found)[:50]


def picker(label: str, key: str, options: list[str], default: str, help: str | None = None) -> str:
    options = [NOT_MAPPED] + [o for o in options if o != NOT_MAPPED]
    if st.session_state.get(key) not in options:  # another file was chosen: start from the default again
        st.session_state[key] = default if default in options else NOT_MAPPED
    return st.selectbox(label, options, key=key, help=help)


def mapping_panel() -> None:
    """Role pickers for the format in use, filled with the chosen file's columns."""
    state = st.session_state
    rows, problem, label = dataset_sample()
    if problem:
        st.error(f"**local_datasets**: {safe(problem)}")
        return
    if not rows:
        st.caption("Column pickers appear once a local file is chosen or uploaded. For hub datasets, map columns "
                   "in 'More mapping' below (role=column per line).")
        return
    columns = columns_of(rows)
    format_type = state[K + "format_type"]
    mapping, _ = current_mapping(state)
    try:
        detected = datasets.normalize_rows(rows, "auto", mapping)
        guess, reason = detected.format, detected.reason
    except DatasetError as exc:
        guess, reason = None, exc.message
    st.caption(f"Columns of {safe(label)}: " + ", ".join(code(c, limit=200) for c in columns))
    if format_type != "auto":
        map_as = format_type
    elif guess:
        map_as = guess
        st.caption(f"Auto-detected format: **{safe(guess)}** ({safe(reason)}).")
    else:
        st.warning(f"**format_type**: {safe(reason)}", icon="🧭")
        map_as = st.radio("Map the columns as", list(ROLE_SLOTS), horizontal=True, key=K + "map_as_choice")
    state[MAP_AS] = map_as
    slots = ROLE_SLOTS[map_as]
    cols = st.columns(len(slots))
    for col, (key, text, required) in zip(cols, slots):
        with col:
            if key in TURN_KEY_SLOTS:
                options = turn_values(rows, mapped_column(state, map_as))
            else:
                options = columns
            picker(text + (" *" if required else ""), f"{K}map_{map_as}_{key}", options, key)
    if map_as in TURN_SLOTS:
        role_pickers(rows, map_as)


def mapped_column(state, map_as: str) -> str:
    column_key = TURN_SLOTS[map_as][0]
    chosen = state.get(f"{K}map_{map_as}_{column_key}", NOT_MAPPED)
    return column_key if chosen in (NOT_MAPPED, None) else chosen


def role_pickers(rows: list[dict], map_as: str) -> None:
    """Which of the data's speaker names is the user, the assistant and the system."""
    state = st.session_state
    role_slot = TURN_SLOTS[map_as][1]
    role_key = state.get(f"{K}map_{map_as}_{role_slot}", NOT_MAPPED)
    role_key = role_slot if role_key in (NOT_MAPPED, None) else role_key
    names = turn_values(rows, mapped_column(state, map_as), role_key)
    unknown = [n for n in names if n.strip().lower() not in datasets.ROLE_ALIASES]
    chosen = any(state.get(f"{K}map_{map_as}_{role}", NOT_MAPPED) not in (NOT_MAPPED, role) for role in ROLE_NAMES)
    if not unknown and not chosen:
        return  # every speaker name is a known one: nothing to ask
    if unknown:
        st.caption("Speaker names the format does not know: " + ", ".join(code(n, limit=200) for n in unknown)
                   + ". Say which is which:")
    cols = st.columns(len(ROLE_NAMES))
    for col, role in zip(cols, ROLE_NAMES):
        with col:
            picker(f"'{role}' is called", f"{K}map_{map_as}_{role}", names, role,
                   help=f"The speaker name in your data that means {role} ({NOT_MAPPED}: the usual names)")


# ---------------------------------------------------------------------- preview
def config_key(cfg: TrainConfig) -> str:
    """What a preview depends on: a change elsewhere (learning rate, LoRA rank) keeps it current."""
    data = cfg.to_public_dict()
    return json.dumps({name: data[name] for name in PREVIEW_FIELDS}, sort_keys=True, default=str)


def current_preview(cfg: TrainConfig | None) -> preview.Preview | None:
    shown = st.session_state.get(PREVIEW)
    if cfg is None or shown is None or isinstance(shown[1], list) or shown[0] != config_key(cfg):
        return None
    return shown[1]


def length_chart(lengths: list[int] | tuple[int, ...], max_seq_length: int) -> alt.LayerChart:
    """Histogram of token lengths, binned here (a 100k-row dataset sends 40 bars), with max_seq_length marked."""
    values = np.asarray(lengths, dtype=float)
    top = max(float(values.max()) if len(values) else 0.0, float(max_seq_length), 1.0)
    counts, edges = np.histogram(values, bins=40, range=(0.0, top))
    bars = pd.DataFrame({"start": edges[:-1], "end": edges[1:], "rows": counts,
                         "part": np.where(edges[1:] > max_seq_length, "truncated", "fits")})
    bar = alt.Chart(bars).mark_bar().encode(
        x=alt.X("start:Q", title="tokens per row"), x2="end:Q", y=alt.Y("rows:Q", title="rows"),
        color=alt.Color("part:N", scale=alt.Scale(domain=["fits", "truncated"], range=["#4c78a8", "#e45756"]),
                        legend=alt.Legend(title=None, orient="top")),
        tooltip=[alt.Tooltip("start:Q", format=".0f"), alt.Tooltip("end:Q", format=".0f"), "rows:Q"])
    rule = alt.Chart(pd.DataFrame({"max_seq_length": [max_seq_length]})).mark_rule(
        color="#e45756", strokeDash=[5, 3], size=2).encode(x="max_seq_length:Q", tooltip=["max_seq_length:Q"])
    return alt.layer(bar, rule).properties(height=220)


def row_html(row: preview.RenderedRow) -> str:
    """A row as the model sees it; trained spans highlighted. Every piece of text is escaped."""
    spans = []
    for text, trained in row.segments:
        piece = html.escape(text)
        spans.append(f'<mark style="background:#c7f0d2;padding:0">{piece}</mark>' if trained else piece)
    return ('<pre style="white-space:pre-wrap;word-break:break-word;font-size:0.8rem;'
            'background:rgba(128,128,128,0.08);padding:0.6rem;border-radius:0.4rem">' + "".join(spans) + "</pre>")


def preview_panel(cfg: TrainConfig | None, errors: list[FieldError]) -> None:
    st.subheader("Data preview")
    st.caption("Tokenizes the data exactly as training will (takes a few seconds the first time).")
    if st.button("Preview data", key=K + "preview_button", icon="🔍"):
        problems = errors + remote_code_errors(st.session_state)
        if cfg is None or problems:
            st.session_state[PREVIEW] = (None, problems)
        else:
            with st.spinner("Loading the tokenizer and rendering rows…"):
                try:
                    st.session_state[PREVIEW] = (config_key(cfg), preview.build_preview(cfg))
                except preview.PreviewError as exc:
                    st.session_state[PREVIEW] = (config_key(cfg), exc.errors)
    shown = st.session_state.get(PREVIEW)
    if shown is None:
        return
    result = shown[1]
    if isinstance(result, list):
        show_errors(result, "No preview")
        return
    if current_preview(cfg) is None:
        st.info("The settings changed since this preview: press Preview data again to update it.", icon="🔄")
    render_preview(result)


def render_preview(p: preview.Preview) -> None:
    st.markdown(f"**Format: {safe(p.format)}** ({safe(p.format_reason)}) · tokenizer: {code(p.tokenizer)}")
    tiles = st.columns(6)
    tiles[0].metric("Training rows", f"{p.total_rows:,}")
    tiles[1].metric("Total tokens", fmt.compact(p.total_tokens), help=f"{p.total_tokens:,}")
    tiles[2].metric("Trained tokens", fmt.compact(p.trained_tokens), help=f"{p.trained_tokens:,}")
    tiles[3].metric("Truncated", f"{p.truncated:,}", help=f"rows longer than max_seq_length={p.max_seq_length}")
    tiles[4].metric("Dropped", f"{sum(p.dropped.values()):,}")
    tiles[5].metric("Steps per epoch", f"{p.steps_per_epoch:,}",
                    help=f"global batch {p.global_batch:,} rows per step ({p.processes} process(es)); "
                         f"{p.eval_rows:,} rows held out for eval")
    if p.dropped:
        st.warning("Dropped rows: " + "; ".join(f"{safe(reason)}: {count}" for reason, count in sorted(p.dropped.items())))
    if p.truncated:
        st.warning(f"{p.truncated} row(s) are longer than max_seq_length={p.max_seq_length} and will be cut: raise "
                   "max_seq_length or accept the cut.")
    if p.lengths:
        st.altair_chart(length_chart(p.lengths, p.max_seq_length), width="stretch")
    trained_all = all(trained for row in p.rows for _, trained in row.segments)
    st.caption("Green: tokens the loss is computed on." if not trained_all
               else "Every token is trained (train on completions is off or the data is raw text).")
    for row in p.rows:
        cut = " · truncated" if row.truncated else ""
        st.markdown(f"**Row {row.index}** · {row.num_tokens} tokens{cut}")
        st.html(row_html(row))


# ---------------------------------------------------------------------- start
def start_run() -> None:
    orch = get_orchestrator()
    cfg, errors = build_config()
    errors += remote_code_errors(st.session_state)
    if cfg is not None and errors:
        # Report the rest of the form too, so one click shows every problem.
        reported = {e.field for e in errors}
        errors += [e for e in orch.validate(cfg) if e.field not in reported]
    if errors:
        show_errors(errors)
        return
    try:
        run_id = orch.start(cfg, actor=current_actor())
    except ConfigError as exc:
        show_errors(exc.errors)
        return
    except RunRefused as exc:
        st.warning(safe(exc), icon="⏳")
        return
    run = orch.get_run(run_id)
    if run is not None and run.status == RunStatus.QUEUED.value:
        st.success(f"Queued '{safe(run.name)}': it starts when the current run ends; see History to reorder the queue.",
                   icon="⏳")
        return
    st.session_state["live_run_id"] = run_id
    st.switch_page("pages/live.py")


# ====================================================================== the page
init_state()
st.title("New run")
if not allowed(current_actor(), Action.START):
    # No form at all: uploads, previews (a child process each) and saved presets are writes too.
    st.info("Viewers watch runs (Live, History, Run details, Compare); an admin can make you an operator "
            "on the Account page.", icon="👀")
    st.stop()
if hardware.cuda_available():
    st.caption("CUDA GPU found: LoRA, QLoRA (4-bit) and full fine-tuning are available.")
else:
    st.caption("No CUDA GPU found: training runs on the CPU. QLoRA, LoftQ and 8-bit optimizers need CUDA.")
presets_panel()

st.subheader("Model")
st.text_input("Run name", key=K + "run_name", help=H("run_name"), placeholder="optional, e.g. smollm2-demo")
st.radio("Model source", list(MODEL_SOURCES), format_func=MODEL_SOURCES.get, horizontal=True,
         key=K + "model_source", help=H("model_name"))
st.text_input("Local folder or hub id", key=K + "model_text",
              placeholder="/path/to/hf-model-folder or org/name (not used for the bundled model)")
col_method, col_seq = st.columns(2)
col_method.selectbox("Method", list(TRAINING_TYPES), format_func=TRAINING_TYPES.get, key=K + "training_type",
                     help=H("training_type"))
col_seq.number_input("Max sequence length", min_value=0, step=64, key=K + "max_seq_length", help=H("max_seq_length"))
with st.expander("Access and remote code"):
    st.text_input("Hugging Face token", type="password", key=K + "hf_token", help=H("hf_token"))
    trust = st.checkbox("Trust remote code", key=K + "trust_remote_code", help=H("trust_remote_code"))
    if trust:
        st.checkbox("I have read this model's code and trust its author", key=K + "trust_remote_code_confirm")
    st.caption("⚠️ Trusting remote code runs Python from the model's repository on this machine, "
               "with your permissions. Only turn it on for authors you trust.")
info = model_panel(model_name(st.session_state[K + "model_source"], st.session_state[K + "model_text"]))

st.subheader("Dataset")
st.radio("Dataset source", list(DATASET_SOURCES), format_func=DATASET_SOURCES.get, horizontal=True,
         key=K + "dataset_source", help=H("local_datasets"))
st.file_uploader("Upload (used with 'Upload a file')", type=UPLOAD_TYPES, key=K + "upload")
st.text_input("Local file path(s) (used with 'Local file path'; comma-separated)", key=K + "local_datasets",
              placeholder="data/train.jsonl")
hub_cols = st.columns(4)
hub_cols[0].text_input("Hub dataset id", key=K + "hf_dataset", help=H("hf_dataset"), placeholder="org/name")
hub_cols[1].text_input("Subset", key=K + "subset", help=H("subset"))
hub_cols[2].text_input("Train split", key=K + "train_split", help=H("train_split"))
hub_cols[3].text_input("Eval split", key=K + "eval_split", help=H("eval_split"))
st.selectbox("Format", FORMAT_TYPES, key=K + "format_type", help=H("format_type"))
mapping_panel()
config, config_errors = build_config()  # after the pickers: they decide which format's mapping applies
with st.expander("System prompt and more mapping"):
    st.text_area("System prompt", key=K + "system_prompt", help=H("system_prompt"))
    st.text_area("More mapping (one role=column per line; wins over the pickers above)",
                 key=K + "custom_format_mapping", help=H("custom_format_mapping"),
                 placeholder="instruction=question\noutput=answer")
with st.expander("Rows and eval set"):
    row_cols = st.columns(3)
    row_cols[0].number_input("Slice start", min_value=0, key=K + "dataset_slice_start", help=H("dataset_slice_start"))
    row_cols[1].number_input("Slice end", min_value=0, key=K + "dataset_slice_end", help=H("dataset_slice_end"))
    row_cols[2].number_input("Eval fraction", min_value=0.0, step=0.05, key=K + "eval_fraction",
                             help=H("eval_fraction"))
    eval_cols = st.columns(3)
    eval_cols[0].number_input("Eval steps", min_value=0, key=K + "eval_steps", help=H("eval_steps"))
    eval_cols[1].number_input("Early stopping patience", min_value=0, key=K + "early_stopping_patience",
                              help="Stop when eval loss has not improved for N evaluations in a row (0: off). "
                                   "Needs an eval set: an eval fraction, an eval split or eval files.")
    eval_cols[2].text_input("Eval files (comma-separated)", key=K + "local_eval_datasets",
                            help=H("local_eval_datasets"))
preview_panel(config, config_errors)

st.subheader("Training")
train_cols = st.columns(4)
train_cols[0].number_input("Epochs", min_value=0.0, step=0.5, key=K + "num_epochs", help=H("num_epochs"))
train_cols[1].number_input("Max steps", min_value=0, step=10, key=K + "max_steps", help=H("max_steps"))
train_cols[2].number_input("Learning rate", min_value=0.0, step=1e-5, format="%.2e", key=K + "learning_rate",
                           help=H("learning_rate"))
train_cols[3].number_input("Batch size", min_value=0, key=K + "batch_size", help=H("batch_size"))
train_cols = st.columns(4)
train_cols[0].number_input("Gradient accumulation", min_value=0, key=K + "gradient_accumulation_steps",
                           help=H("gradient_accumulation_steps"))
train_cols[1].number_input("Warmup steps", min_value=0, key=K + "warmup_steps", help=H("warmup_steps"))
train_cols[2].number_input("Warmup ratio", min_value=0.0, step=0.01, key=K + "warmup_ratio", help=H("warmup_ratio"))
train_cols[3].number_input("Embedding learning rate", min_value=0.0, step=1e-6, format="%.2e",
                           key=K + "embedding_learning_rate", help=H("embedding_learning_rate"))

with st.expander("Advanced training"):
    adv = st.columns(4)
    adv[0].number_input("Weight decay", min_value=0.0, step=0.01, key=K + "weight_decay", help=H("weight_decay"))
    adv[1].number_input("Max grad norm", min_value=0.0, step=0.1, key=K + "max_grad_norm", help=H("max_grad_norm"))
    adv[2].selectbox("Scheduler", SCHEDULERS, key=K + "lr_scheduler_type", help=H("lr_scheduler_type"))
    adv[3].selectbox("Optimizer", OPTIMIZERS, key=K + "optim", help=H("optim"))
    adv = st.columns(4)
    adv[0].number_input("Seed", key=K + "random_seed", step=1, help=H("random_seed"))
    adv[1].number_input("Logging steps", min_value=0, key=K + "logging_steps", help=H("logging_steps"))
    adv[2].number_input("Save steps", min_value=0, key=K + "save_steps", help=H("save_steps"))
    adv[3].text_input("GPU ids (comma-separated)", key=K + "gpu_ids", help=H("gpu_ids"))
    adv = st.columns(4)
    adv[0].checkbox("Packing", key=K + "packing", help=H("packing"))
    adv[1].checkbox("Train on completions only", key=K + "train_on_completions", help=H("train_on_completions"))
    adv[2].checkbox("Gradient checkpointing", key=K + "gradient_checkpointing", help=H("gradient_checkpointing"))
    adv[3].checkbox("Load in 4-bit", key=K + "load_in_4bit", help=H("load_in_4bit"))
    adv = st.columns(4)
    adv[0].number_input("Processes (0: one per GPU)", min_value=0, step=1, key=K + "num_processes",
                        help=H("num_processes"))
    st.text_input("Resume from checkpoint", key=K + "resume_from_checkpoint", help=H("resume_from_checkpoint"))
    st.checkbox("Start even when the memory estimate is far above this device's memory",
                key=K + "allow_memory_overcommit", help=H("allow_memory_overcommit"))

with st.expander("LoRA"):
    lora = st.columns(4)
    lora[0].number_input("Rank (r)", min_value=0, key=K + "lora_r", help=H("lora_r"))
    lora[1].number_input("Alpha", min_value=0, key=K + "lora_alpha", help=H("lora_alpha"))
    lora[2].number_input("Dropout", min_value=0.0, step=0.05, key=K + "lora_dropout", help=H("lora_dropout"))
    lora[3].checkbox("LoRA for continued pretraining", key=K + "use_lora", help=H("use_lora"))
    st.multiselect("Target modules", MODULE_CHOICES, key=K + "target_modules",
                   help=H("target_modules") + " Clear it to pick modules with the switches below.")
    st.text_input("More target modules (comma-separated)", key=K + "extra_modules")
    lora = st.columns(5)
    lora[0].checkbox("rsLoRA", key=K + "use_rslora", help=H("use_rslora"))
    lora[1].checkbox("LoftQ", key=K + "use_loftq", help=H("use_loftq"))
    lora[2].checkbox("Attention modules", key=K + "finetune_attention_modules", help=H("finetune_attention_modules"))
    lora[3].checkbox("MLP modules", key=K + "finetune_mlp_modules", help=H("finetune_mlp_modules"))
    lora[4].checkbox("Language layers", key=K + "finetune_language_layers", help=H("finetune_language_layers"))

with st.expander("Logging"):
    log_cols = st.columns(3)
    log_cols[0].toggle("Weights & Biases", key=K + "enable_wandb", help=H("enable_wandb"))
    log_cols[1].text_input("W&B project", key=K + "wandb_project", help=H("wandb_project"))
    log_cols[2].text_input("W&B API key", type="password", key=K + "wandb_token", help=H("wandb_token"))
    tb_cols = st.columns(3)
    tb_cols[0].toggle("TensorBoard", key=K + "enable_tensorboard", help=H("enable_tensorboard"))
    tb_cols[1].text_input("TensorBoard folder", key=K + "tensorboard_dir", help=H("tensorboard_dir"))

memory_panel(info, config)
remember_state()
if config is not None:
    st.download_button("Download as YAML", config.to_yaml(), file_name="run.yaml", mime="application/x-yaml",
                       help="The same file runs headless: python -m trainer_core run --config run.yaml")
if st.button("Start training", type="primary", icon="🚀", key=K + "start"):
    start_run()
