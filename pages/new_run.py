"""New run: presets, model facts and memory, dataset mapping and preview, and every TrainConfig knob.

No ``st.form``: the column mapping, the model panel and the memory estimate react as soon as a value
changes. Every widget reads and writes ``st.session_state`` under ``nr_<field>``, so a preset fills
the page by writing those keys, and the config is built from the state wherever it is needed. The
page stays cheap on each rerun: model facts and dataset columns are cached, and the data preview (a
tokenizer in a subprocess) runs only when asked for. Layout only: the widget <-> config mapping is
``ui/form.py``, the column sniffing ``trainer_core/data/formats.py``, the length chart ``charts.py``.

Kept whole: a Streamlit page runs top to bottom and its sections read one session state in order (the model decides
the method list, the data decides the pickers, both decide the preview); each section's logic already lives in ui/
(form, vision, speech_panel, ray_cluster) and the page only lays it out.
"""
from __future__ import annotations

import dataclasses
import html
import math
from pathlib import Path

import pandas as pd
import streamlit as st

from trainer_core.planning import memory, model_info
from trainer_core.host import parallel
from trainer_core.data import preview
from trainer_core.recipes import store as recipe_store
from trainer_core.host import hardware
from trainer_core.config import presets
from trainer_core.config import promptsets
from trainer_core.auth.access import Action, Role, allowed
from trainer_core.views.charts import length_chart
from trainer_core.config import (FORMAT_TYPES, OPTIMIZERS, SCHEDULERS, TOOL_TEMPLATES, ConfigError, FieldError,
                                 TrainConfig)
from trainer_core.data import DatasetError, formats
from trainer_core.data import audio as audio_data
from trainer_core.data.readers import read_rows
from trainer_core.jobs.orchestrator import RunRefused
from trainer_core.methods import ADAPTERS, METHODS
from trainer_core.protocol.status import RunStatus
from trainer_core.worker import engines
from ui import form, ray_cluster, speech_panel, vision
from ui import format as fmt
from ui.auth import current_actor
from ui.entry import require_entrypoint
from ui.server_paths import shown
from ui.form import BASE, DATASET_SOURCES, K, MAP_AS, MODEL_SOURCES, MODULE_CHOICES, NOT_MAPPED, PREVIEW, SAVED
from ui import sweeps as sweeps_ui
from ui.state import get_orchestrator, get_sweeps
from ui.text import code, safe

require_entrypoint("pages/new_run.py")

H = TrainConfig.help
SAMPLE_ROWS = 100  # rows read for the mapping pickers and the format guess


# ---------------------------------------------------------------------- widget state
def init_state() -> None:
    """Widget values: kept ones first (after a visit to another page), else the loaded preset or defaults."""
    base = st.session_state.get(BASE) or TrainConfig()
    for key, value in {**form.config_to_state(base), **st.session_state.get(SAVED, {})}.items():
        st.session_state.setdefault(key, value)


def remember_state() -> None:
    state = st.session_state
    state[SAVED] = {key: state[key] for key in form.remembered_keys(state) if key in state}


def apply_preset() -> None:
    """Button callback (runs before the widgets exist, so it may set their values)."""
    name = st.session_state.get(K + "preset_choice")
    try:
        cfg = presets.load_preset(name)
    except ConfigError as exc:
        st.session_state[K + "preset_message"] = ("error", exc.errors)
        return
    unknown = form.choice_problems(cfg)
    if unknown:  # a selectbox cannot show a value outside its options
        st.session_state[K + "preset_message"] = ("error", unknown)
        return
    for key in [key for key in st.session_state if str(key).startswith(K + "map_")]:
        del st.session_state[key]  # the preset's mapping is shown in the text box; pickers start afresh
    st.session_state.pop(SAVED, None)
    st.session_state.update(form.config_to_state(cfg))
    st.session_state[BASE] = cfg
    st.session_state[K + "preset_message"] = ("success", f"Loaded preset '{name}'.")


def show_errors(errors: list[FieldError], headline: str = "The run was not started") -> None:
    st.error(f"{headline}: {len(errors)} problem(s) to fix.", icon="🚫")
    for error in errors:
        st.error(f"**{safe(error.field)}**: {safe(shown(error.message))}")


# ---------------------------------------------------------------------- presets
def method_section(chosen: str) -> None:
    """Every method's own settings (its spec's section), the chosen method's editable: the others keep
    their values (a preset may set them) but do not apply."""
    fields = form.SECTION_FIELDS
    if not fields:
        return
    types = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    cols = st.columns(max(len(fields), 2))
    for col, name in zip(cols, fields):
        owner = form.section_owner(name)
        label = f"{form.section_label(name)} ({owner})"
        other = owner != chosen
        if types[name] == "bool":
            col.checkbox(label, key=K + name, help=H(name), disabled=other)
        elif types[name] == "float":
            col.number_input(label, min_value=0.0, step=1e-6, format="%.2e", key=K + name, help=H(name),
                             disabled=other)
        else:
            col.number_input(label, min_value=0, key=K + name, help=H(name), disabled=other)


def settings_section(chosen: str) -> None:
    """The chosen method's own settings as YAML (the section a preset or YAML file holds), each setting's help
    below it, and for GRPO a check of its rewards on a few real rows before the start."""
    spec = METHODS[chosen]
    if spec.settings is None:
        return
    with st.expander(f"{spec.label}: settings", expanded=chosen == "grpo", icon="⚙️"):
        st.text_area(f"`{chosen}` settings (YAML; empty: every default)", key=form.settings_key(chosen), height=140,
                     help=H("method_settings"))
        rows = [{"setting": f.name, "default": fmt_default(f), "what it does": f.metadata.get("help", "")}
                for f in dataclasses.fields(spec.settings)]
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
        if chosen == "grpo":
            reward_check_panel()


def fmt_default(f: dataclasses.Field) -> str:
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return str(value)


def reward_check_panel() -> None:
    """Each reward run on a few real rows (the data's reference answers), in a child process: its scores, their
    spread, and any exception with its line. A custom Python reward runs its code: an admin's button only."""
    if not st.button("Check rewards", icon="🎯", key=K + "check_rewards",
                     help="Runs each reward on 4 rows of the dataset with their reference answers (answer, "
                          "completion, chosen, solution or output column); no model is loaded"):
        return
    cfg, errors = form.build_config(st.session_state, with_secrets=False)
    if cfg is not None:
        errors = errors + cfg.validate()
    if errors:
        show_errors(errors, "The rewards were not checked")
        return
    from trainer_core.methods import grpo
    from trainer_core.rewards import check as reward_check
    from trainer_core.rewards import spec as reward_spec

    if reward_spec.needs_admin(grpo.rewards_of(cfg)) and current_actor().role is not Role.ADMIN:
        st.warning("A custom Python reward runs its code on this host: only an admin may check or start it. "
                   "Use the built-in rewards, or ask an admin.", icon="🔒")
        return
    with st.spinner("Scoring the rewards on 4 rows"):
        result = reward_check.check_rewards(cfg, who=current_actor().name)  # one check per person at a time
    if result.errors:
        show_errors(list(result.errors), "The rewards were not checked")
        return
    st.dataframe(pd.DataFrame([{"reward": r.name, "kind": r.kind, "weight": r.weight,
                                "mean": r.mean, "spread": r.spread,
                                "scores": ", ".join("None" if v is None else f"{v:.3g}" for v in r.scores),
                                "error": r.error or ""} for r in result.rewards]),
                 hide_index=True, width="stretch")
    for warning in result.warnings():
        st.warning(safe(warning), icon="⚠️")
    if result.ok and not result.warnings():
        st.success(f"Every reward scored the {len(result.samples)} completions with some spread.", icon="✅")


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
    cfg, errors = form.build_config(st.session_state, with_secrets=False)
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
        st.warning(f"**model_name**: {safe(shown(problem))}", icon="🔎")
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
    if cfg.launcher == "ray":  # the workers train on the cluster's nodes: their GPU or RAM, not this host's
        device, dev = ray_cluster.worker_device(cfg)
    else:
        device, dev = ("cuda" if hardware.cuda_available() else "cpu"), memory.device_memory(cfg)
    shown = form.current_preview(st.session_state, cfg)
    longest = max(shown.lengths) if shown is not None and shown.lengths else None
    # On a Ray cluster num_processes is the number of workers (0 or 1: one), never this host's GPU count.
    processes = max(cfg.num_processes, 1) if cfg.launcher == "ray" else parallel.process_count(cfg)
    engine = engines.choose_engine(processes) if device == "cuda" else memory.TRANSFORMERS
    est = memory.estimate_memory(info, cfg, device, longest_row=longest, engine=engine)
    table_col, fit_col = st.columns([2, 3])
    table = pd.DataFrame([(part, f"{gb:.2f}") for part, gb in est.rows()], columns=["part", "GB"])
    table_col.dataframe(table, hide_index=True, width="stretch")
    free = f"{dev.free_gb:.1f} GB free of {dev.total_gb:.1f} GB" if math.isfinite(dev.free_gb) else "free memory unknown"
    fit_col.metric(f"Estimated need on {device.upper()}", f"{est.total_gb:.1f} GB", help=f"{dev.label}: {free}")
    sized = (f"sized from the longest row in the preview ({longest:,} tokens)" if longest and not cfg.packing
             else f"assuming rows of max_seq_length={cfg.max_seq_length}; Preview data sizes it from your data")
    fit_col.caption(f"{dev.label}: {free} · {est.trainable_params:,} trainable parameters · {sized} · "
                    f"{engine} engine, per {'Ray worker' if cfg.launcher == 'ray' else 'process'}")
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
        return read_rows(Path(path))[:SAMPLE_ROWS], ""
    except DatasetError as exc:
        return [], exc.message


def dataset_sample() -> tuple[list[dict], str, str]:
    """(rows, problem, which file) for the mapping pickers: the first local file; nothing for hub data."""
    path, problem, label = form.sample_source(st.session_state)
    if path is None:
        return [], problem, label
    stat = path.stat()
    rows, problem = sample_rows(str(path), (stat.st_mtime_ns, stat.st_size))
    return rows, problem, label


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
        st.error(f"**local_datasets**: {safe(shown(problem))}")
        return
    if not rows:
        st.caption("Column pickers appear once a local file is chosen or uploaded. For hub datasets, map columns "
                   "in 'More mapping' below (role=column per line).")
        return
    columns = formats.columns_of(rows)
    if vision.image_format_note(rows):  # image rows have one shape and no column pickers (docs/vision.md)
        return
    format_type = state[K + "format_type"]
    mapping, _ = form.current_mapping(state)
    try:
        detected = formats.normalize_rows(rows, "auto", mapping)
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
        st.warning(f"**format_type**: {safe(shown(reason))}", icon="🧭")
        map_as = st.radio("Map the columns as", list(form.ROLE_SLOTS), horizontal=True, key=K + "map_as_choice")
    state[MAP_AS] = map_as
    slots = form.ROLE_SLOTS[map_as]
    cols = st.columns(len(slots))
    for col, (key, text, required) in zip(cols, slots):
        with col:
            if key in form.TURN_KEY_SLOTS:
                options = formats.turn_values(rows, form.mapped_column(state, map_as))
            else:
                options = columns
            picker(text + (" *" if required else ""), f"{K}map_{map_as}_{key}", options, key)
    if map_as in form.TURN_SLOTS:
        role_pickers(rows, map_as)


def role_pickers(rows: list[dict], map_as: str) -> None:
    """Which of the data's speaker names is the user, the assistant and the system."""
    state = st.session_state
    names = formats.turn_values(rows, form.mapped_column(state, map_as), form.mapped_role_key(state, map_as))
    unknown = formats.unknown_speakers(names)
    if not unknown and not form.speakers_chosen(state, map_as):
        return  # every speaker name is a known one: nothing to ask
    if unknown:
        st.caption("Speaker names the format does not know: " + ", ".join(code(n, limit=200) for n in unknown)
                   + ". Say which is which:")
    cols = st.columns(len(form.ROLE_NAMES))
    for col, role in zip(cols, form.ROLE_NAMES):
        with col:
            picker(f"'{role}' is called", f"{K}map_{map_as}_{role}", names, role,
                   help=f"The speaker name in your data that means {role} ({NOT_MAPPED}: the usual names)")


# ---------------------------------------------------------------------- preview
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
        problems = errors + form.remote_code_errors(st.session_state, current_actor().role is Role.ADMIN)
        if cfg is None or problems:
            st.session_state[PREVIEW] = (None, problems)
        else:
            with st.spinner("Loading the tokenizer and rendering rows…"):
                try:
                    st.session_state[PREVIEW] = (form.config_key(cfg), preview.build_preview(cfg))
                except preview.PreviewError as exc:
                    st.session_state[PREVIEW] = (form.config_key(cfg), exc.errors)
    shown = st.session_state.get(PREVIEW)
    if shown is None:
        return
    result = shown[1]
    if isinstance(result, list):
        show_errors(result, "No preview")
        return
    if form.current_preview(st.session_state, cfg) is None:
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
    if p.tool_template:
        st.markdown(f"**Tools:** conversations with tools train with {safe(p.tool_template)}. Trained: the "
                    "assistant's calls and answers (tool results too with Train on tool results).")
    if p.tool_problems:
        st.warning("Rows that do not fit their tools: " + "; ".join(safe(problem) for problem in p.tool_problems))
    if p.lengths:
        st.altair_chart(length_chart(p.lengths, p.max_seq_length), width="stretch")
    trained_all = all(trained for row in p.rows for _, trained in row.segments)
    st.caption("Green: tokens the loss is computed on." if not trained_all
               else "Every token is trained (train on completions is off or the data is raw text).")
    for row in p.rows:
        cut = " · truncated" if row.truncated else ""
        side = f" · {safe(row.label)}" if row.label else ""
        st.markdown(f"**Row {row.index}**{side} · {row.num_tokens} tokens{cut}")
        st.html(row_html(row))


# ---------------------------------------------------------------------- start
def start_run() -> None:
    orch = get_orchestrator()
    cfg, errors = form.build_config(st.session_state)
    errors += form.remote_code_errors(st.session_state, current_actor().role is Role.ADMIN)
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
col_method, col_adapter, col_seq = st.columns(3)
chosen_method = col_method.selectbox("Method", list(METHODS), format_func=lambda name: METHODS[name].label,
                                     key=K + "method", help=H("method"))
col_adapter.selectbox("Adapter", list(ADAPTERS), format_func=ADAPTERS.get, key=K + "adapter", help=H("adapter"))
col_seq.number_input("Max sequence length", min_value=0, step=64, key=K + "max_seq_length", help=H("max_seq_length"))
st.caption(safe(METHODS[chosen_method].help))
method_section(chosen_method)
settings_section(chosen_method)
with st.expander("Access and remote code"):
    st.text_input("Hugging Face token", type="password", key=K + "hf_token", help=H("hf_token"))
    may_trust = current_actor().role is Role.ADMIN
    trust = st.checkbox("Trust remote code", key=K + "trust_remote_code", help=H("trust_remote_code"),
                        disabled=not may_trust and not st.session_state.get(K + "trust_remote_code"))
    if not may_trust:
        st.caption("🔒 Only an admin may trust remote code (it runs Python from the model's repository on this host).")
    if trust:
        st.checkbox("I have read this model's code and trust its author", key=K + "trust_remote_code_confirm")
    st.caption("⚠️ Trusting remote code runs Python from the model's repository on this machine, "
               "with your permissions. Only turn it on for authors you trust.")
chosen_model = form.model_name(st.session_state[K + "model_source"], st.session_state[K + "model_text"], chosen_method)
info = model_panel(chosen_model)
vision_info = vision.modality_panel(chosen_model,
                                    st.session_state.get(K + "hf_token", "").strip() or None,
                                    st.session_state[K + "max_seq_length"])
if vision_info is not None and vision_info.is_vision:
    st.number_input("Image max side (px; 0: as they are)", min_value=0, max_value=8192, step=64,
                    key=K + "image_max_side", help=H("image_max_side"))
    st.caption(safe(vision_info.resize_effect(int(st.session_state[K + "image_max_side"] or 0))))

st.subheader("Dataset")
st.radio("Dataset source", list(DATASET_SOURCES), format_func=DATASET_SOURCES.get, horizontal=True,
         key=K + "dataset_source", help=H("local_datasets"))
recipe_versions = recipe_store.published()
st.selectbox("Dataset made by a recipe (used with 'Made by a recipe'; the Data page makes them)",
             [""] + [v.ref for v in recipe_versions], key=K + "recipe_dataset",
             format_func=lambda ref: next((f"{v.name}@v{v.version} · {v.card.get('kept', '?')} rows · "
                                           f"{v.card.get('starter') or 'custom'}" for v in recipe_versions
                                           if v.ref == ref), "—"))
st.file_uploader("Upload (used with 'Upload a file')", type=form.UPLOAD_TYPES, key=K + "upload")
st.text_input("Local file path(s) (used with 'Local file path'; comma-separated)", key=K + "local_datasets",
              placeholder="data/train.jsonl")
hub_cols = st.columns(4)
hub_cols[0].text_input("Hub dataset id", key=K + "hf_dataset", help=H("hf_dataset"), placeholder="org/name")
hub_cols[1].text_input("Subset", key=K + "subset", help=H("subset"))
hub_cols[2].text_input("Train split", key=K + "train_split", help=H("train_split"))
hub_cols[3].text_input("Eval split", key=K + "eval_split", help=H("eval_split"))
st.selectbox("Format", FORMAT_TYPES, key=K + "format_type", help=H("format_type"))
mapping_panel()
vision.thumbnails_panel(dataset_sample()[0], form.sample_source(st.session_state)[0], vision_info)
config, config_errors = form.build_config(st.session_state)  # after the pickers: they decide which format's mapping applies
if config is not None and config.method in ("stt", "tts"):  # players and a duration histogram of the chosen clips
    speech_panel.clips_panel(dataset_sample()[0], form.sample_source(st.session_state)[0],
                             config.method_settings.columns or None, speech_panel.clip_limit(config))
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
ray_cluster.where_to_run()  # this host or the Ray cluster; the number of processes (Ray workers)

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
    adv[1].checkbox("Gradient checkpointing", key=K + "gradient_checkpointing", help=H("gradient_checkpointing"))
    adv[2].checkbox("Load in 4-bit", key=K + "load_in_4bit", help=H("load_in_4bit"))
    adv = st.columns(4)
    adv[0].selectbox("Tool template", TOOL_TEMPLATES, key=K + "tool_template", help=H("tool_template"))
    adv[1].checkbox("Train on tool results", key=K + "train_on_tool_results", help=H("train_on_tool_results"))
    st.text_input("Resume from checkpoint", key=K + "resume_from_checkpoint", help=H("resume_from_checkpoint"))
    st.checkbox("Start even when the memory estimate is far above this device's memory",
                key=K + "allow_memory_overcommit", help=H("allow_memory_overcommit"))

with st.expander("LoRA"):
    lora = st.columns(4)
    lora[0].number_input("Rank (r)", min_value=0, key=K + "lora_r", help=H("lora_r"))
    lora[1].number_input("Alpha", min_value=0, key=K + "lora_alpha", help=H("lora_alpha"))
    lora[2].number_input("Dropout", min_value=0.0, step=0.05, key=K + "lora_dropout", help=H("lora_dropout"))
    st.multiselect("Target modules", MODULE_CHOICES, key=K + "target_modules",
                   help=H("target_modules") + " Clear it to pick modules with the switches below.")
    st.text_input("More target modules (comma-separated)", key=K + "extra_modules")
    lora = st.columns(5)
    lora[0].checkbox("rsLoRA", key=K + "use_rslora", help=H("use_rslora"))
    lora[1].checkbox("LoftQ", key=K + "use_loftq", help=H("use_loftq"))
    lora[2].checkbox("Attention modules", key=K + "finetune_attention_modules", help=H("finetune_attention_modules"))
    lora[3].checkbox("MLP modules", key=K + "finetune_mlp_modules", help=H("finetune_mlp_modules"))
    lora[4].checkbox("Language layers", key=K + "finetune_language_layers", help=H("finetune_language_layers"))
    st.text_input("Start from adapter", key=K + "init_adapter", help=H("init_adapter"))

with st.expander("Logging"):
    log_cols = st.columns(3)
    log_cols[0].toggle("Weights & Biases", key=K + "enable_wandb", help=H("enable_wandb"))
    log_cols[1].text_input("W&B project", key=K + "wandb_project", help=H("wandb_project"))
    log_cols[2].text_input("W&B API key", type="password", key=K + "wandb_token", help=H("wandb_token"))
    tb_cols = st.columns(3)
    tb_cols[0].toggle("TensorBoard", key=K + "enable_tensorboard", help=H("enable_tensorboard"))
    tb_cols[1].text_input("TensorBoard folder", key=K + "tensorboard_dir", help=H("tensorboard_dir"))

with st.expander("Samples during training"):
    st.text_area(f"Sample prompts (one per line; a line holding only `{form.PROMPT_SEPARATOR}` separates prompts of "
                 "several lines)", key=K + "sample_prompts", help=H("sample_prompts"),
                 placeholder="What is the capital of France?\nWrite one sentence about the ocean.")
    sample_cols = st.columns(3)
    sample_cols[0].selectbox("Or a prompt set", form.prompt_set_options(st.session_state[K + "sample_prompt_set"],
                                                                        promptsets.names()),
                             key=K + "sample_prompt_set", format_func=lambda n: n or "— none —",
                             help=H("sample_prompt_set"))
    sample_cols[1].number_input("Sample every N steps (0: at each evaluation)", min_value=0,
                                key=K + "sample_every_steps", help=H("sample_every_steps"))
    sample_cols[2].number_input("Max new tokens per answer", min_value=0, key=K + "sample_max_new_tokens",
                                help=H("sample_max_new_tokens"))
    st.text_area("Sample images (vision runs: line i is the image of prompt i; an empty line for a text-only prompt)",
                 key=K + "sample_images", help=H("sample_images"), height=80, placeholder="shapes/held-out-1.png")

memory_panel(info, config)
remember_state()
if config is not None:
    st.download_button("Download as YAML", config.to_yaml(), file_name="run.yaml", mime="application/x-yaml",
                       help="The same file runs headless: python -m trainer_core run --config run.yaml")
with st.expander("Sweep: search these settings instead of one run"):
    st.caption("Each trial is an ordinary run of this form's config with the searched settings set (docs/sweeps.md). "
               "Settings are TrainConfig keys; a method's own are dotted (dpo.beta).")
    st.text_area("Sweep (YAML)", value=sweeps_ui.SWEEP_EXAMPLE, key=K + "sweep_yaml", height=230)
    if st.button("Start sweep", icon="🧭", key=K + "start_sweep"):
        if config is None or config_errors:
            show_errors(config_errors, "The sweep was not started")
        else:
            sweep_id, sweep_errors = sweeps_ui.start_from_form(get_sweeps(), config, st.session_state[K + "sweep_yaml"],
                                                               current_actor())
            if sweep_errors:
                show_errors(sweep_errors, "The sweep was not started")
            else:
                st.session_state["sweep_pick"] = sweep_id  # the Sweeps page opens on it
                st.switch_page("pages/sweeps.py")
if st.button("Start training", type="primary", icon="🚀", key=K + "start"):
    start_run()
