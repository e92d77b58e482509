"""The New run form <-> TrainConfig mapping, without Streamlit: parsers, widget values, column mapping.

Every widget of the New run page reads and writes ``st.session_state`` under ``nr_<name>``; the functions
here take that state as a plain mapping (a dict in the tests), so what the form builds from its widgets,
and what a preset or a loaded config puts back into them, is unit-tested without running the page.
Defaults come from ``TrainConfig()``; validation is the config's, every problem reported at once.

Kept whole: the two directions of one mapping (widgets -> TrainConfig and TrainConfig -> widgets) must stay
symmetrical field by field, and are tested as a pair.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import yaml

from trainer_core.config import (
    BUNDLED_DATASET,
    BUNDLED_MODEL,
    DEFAULT_TARGET_MODULES,
    FORMAT_TYPES,
    OPTIMIZERS,
    SCHEDULERS,
    SECRET_FIELDS,
    TOOL_TEMPLATES,
    ConfigError,
    FieldError,
    TrainConfig,
    load_yaml,
    looks_like_path,
)
from trainer_core.methods.cpt import EMBEDDING_MODULES
from trainer_core.data import DatasetError
from trainer_core.data.sources import SUPPORTED_EXTENSIONS, resolve_source, save_upload
from trainer_core.methods import ADAPTERS, METHODS, embedding
from trainer_core.data.preview import PREVIEW_FIELDS
from trainer_core.recipes import store as recipe_store

K = "nr_"  # widget-key prefix; secrets live only in their own widget's state
BASE = K + "base"  # the loaded preset: fields without a widget keep its values
SAVED = K + "saved"  # widget values kept while the user is on another page (Streamlit drops them)
UPLOADS = K + "uploads"  # upload file_id -> saved path, so an upload is hashed and written once
PREVIEW = K + "preview"  # (config key, Preview | list[FieldError]) of the last "Preview data"
MAP_AS = K + "map_as"  # the format whose role pickers were shown last

MODEL_SOURCES = {"bundled": "Bundled (SmolLM2-135M-Instruct; all-MiniLM-L6-v2 for embedding)", "local": "Local folder",
                 "hub": "Hugging Face hub id"}
DATASET_SOURCES = {"bundled": "Bundled demo", "recipe": "Made by a recipe", "upload": "Upload a file",
                   "local": "Local file path", "hub": "Hugging Face hub dataset"}
UPLOAD_TYPES = [ext.lstrip(".") for ext in SUPPORTED_EXTENSIONS]
EXTRA_MODULES = list(EMBEDDING_MODULES)
MODULE_CHOICES = DEFAULT_TARGET_MODULES + EXTRA_MODULES
CHOICES = {"method": list(METHODS), "adapter": list(ADAPTERS), "format_type": FORMAT_TYPES,
           "lr_scheduler_type": SCHEDULERS, "optim": OPTIMIZERS, "tool_template": TOOL_TEMPLATES}  # selectboxes
# The method sections: each registered method's own fields (its spec's ``section``), shown together under
# the Method picker, those of the other methods greyed out. A label per field; a new method adds its lines.
SECTION_LABELS = {"train_on_completions": "Train on completions only",
                  "embedding_learning_rate": "Embedding learning rate"}
SECTION_FIELDS = tuple(dict.fromkeys(name for spec in METHODS.values() for name in spec.section))
NOT_MAPPED = "—"
# Each method's own settings (its settings dataclass: the YAML section named after it, ``dpo: {beta: 0.1}``,
# GRPO's rewards among them), edited as YAML in one text area per method: what a preset or YAML file holds.
SETTINGS_METHODS = tuple(name for name, spec in METHODS.items() if spec.settings is not None)
SETTINGS_TEXT_MAX = 100_000  # a settings section is a few lines; GRPO's rewards a few dozen

# Fields whose widget holds exactly the config value, under the key nr_<field>.
PLAIN_FIELDS = (
    "run_name", "method", "adapter", "max_seq_length", "load_in_4bit", "trust_remote_code", "hf_dataset", "format_type",
    "subset", "train_split", "eval_split", "eval_fraction", "eval_steps", "early_stopping_patience",
    "dataset_slice_start", "dataset_slice_end", "system_prompt", "num_epochs", "max_steps", "learning_rate",
    "embedding_learning_rate", "batch_size", "gradient_accumulation_steps", "warmup_steps", "warmup_ratio",
    "weight_decay", "max_grad_norm", "lr_scheduler_type", "optim", "random_seed", "packing", "train_on_completions",
    "gradient_checkpointing", "logging_steps", "save_steps", "resume_from_checkpoint", "allow_memory_overcommit",
    "image_max_side", "tool_template", "train_on_tool_results",
    "lora_r", "init_adapter",
    "lora_alpha", "lora_dropout", "use_rslora", "use_loftq", "finetune_attention_modules", "finetune_mlp_modules",
    "finetune_language_layers", "enable_wandb", "wandb_project", "enable_tensorboard", "tensorboard_dir",
    "num_processes", "launcher", "ray_address", "ray_gpus_per_worker", "ray_max_failures",
)
STRIPPED_FIELDS = ("run_name", "hf_dataset", "subset", "train_split", "eval_split", "wandb_project",
                   "resume_from_checkpoint", "init_adapter", "tensorboard_dir", "ray_address")
# Widgets that are not one config field each (the model and dataset pickers, lists typed as text).
OTHER_WIDGETS = ("model_source", "model_text", "dataset_source", "recipe_dataset", "local_datasets",
                 "local_eval_datasets", "custom_format_mapping", "target_modules", "extra_modules", "gpu_ids")
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


# ---------------------------------------------------------------------- small parsers
def split_list(text: str) -> list[str]:
    """Entries separated by commas or new lines, blanks dropped."""
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
        return [int(part) for part in split_list(text)], []
    except ValueError:
        return [], [FieldError("gpu_ids", f"write GPU numbers separated by commas, such as 0,1; got {text!r}")]


def model_name(source: str, text: str, method: str = "sft") -> str:
    text = text.strip()
    if source == "bundled":  # the bundled model of the method's kind: an embedding run gets the embedding model
        return embedding.BUNDLED_MODEL if method == embedding.SPEC.name else BUNDLED_MODEL
    if source == "local" and text and not looks_like_path(text):
        return "./" + text  # a relative folder name must not be mistaken for a hub id
    return text


# ---------------------------------------------------------------------- config -> widget values
def settings_key(method: str) -> str:
    return K + f"settings_{method}"


def settings_text(values: dict) -> str:
    return yaml.safe_dump(values, sort_keys=False, allow_unicode=True) if values else ""


def settings_values(state: Mapping, method: str) -> tuple[dict | None, list[FieldError]]:
    """A method's settings from its text area: {} when empty (the defaults), None with the problem when the text
    is not a YAML mapping (the method's own checks name bad settings later, field by field)."""
    text = state.get(settings_key(method)) or ""
    if not text.strip():
        return {}, []
    example = "e.g. beta: 0.1" if method != "grpo" else "e.g. rewards: [{type: length, target: 20}]"
    if len(text) > SETTINGS_TEXT_MAX:
        return None, [FieldError(method, f"{len(text):,} characters is more than settings can be "
                                         f"({SETTINGS_TEXT_MAX:,}): keep only the settings you change")]
    try:
        data = load_yaml(text)
    except (yaml.YAMLError, RecursionError) as exc:
        return None, [FieldError(method, f"not valid YAML ({str(exc).splitlines()[0][:200]}): write one "
                                         f"setting: value per line, {example}")]
    if not isinstance(data, dict):
        return None, [FieldError(method, f"write a mapping of setting: value, {example}")]
    return data, []


def config_to_state(cfg: TrainConfig) -> dict[str, Any]:
    """The widget values that show ``cfg`` (secrets are left alone: they never come from a config)."""
    state = {K + name: getattr(cfg, name) for name in PLAIN_FIELDS}
    if cfg.model_name in (BUNDLED_MODEL, embedding.BUNDLED_MODEL):
        state.update({K + "model_source": "bundled", K + "model_text": ""})
    else:
        source = "local" if looks_like_path(cfg.model_name) else "hub"
        state.update({K + "model_source": source, K + "model_text": cfg.model_name})
    if cfg.hf_dataset:
        source = "hub"
    elif cfg.local_datasets == [BUNDLED_DATASET] or not cfg.local_datasets:
        source = "bundled"
    elif len(cfg.local_datasets) == 1 and recipe_store.of_path(cfg.local_datasets[0]) is not None:
        source = "recipe"
        found = recipe_store.of_path(cfg.local_datasets[0])
        state[K + "recipe_dataset"] = found.ref
    else:
        source = "local"
    state[K + "dataset_source"] = source
    state[K + "local_datasets"] = ", ".join(cfg.local_datasets) if source == "local" else ""
    state[K + "local_eval_datasets"] = ", ".join(cfg.local_eval_datasets)
    state[K + "custom_format_mapping"] = "".join(f"{k}={v}\n" for k, v in cfg.custom_format_mapping.items())
    state[K + "target_modules"] = [m for m in cfg.target_modules if m in MODULE_CHOICES]
    state[K + "extra_modules"] = ", ".join(m for m in cfg.target_modules if m not in MODULE_CHOICES)
    state[K + "gpu_ids"] = ", ".join(str(g) for g in cfg.gpu_ids)
    state.update(sample_state(cfg))
    settings = cfg.to_public_dict()  # the method's settings as its section (dpo: {...}); other methods' stay empty
    state.update({settings_key(m): settings_text(settings.get(m) or {}) for m in SETTINGS_METHODS})
    return state


def remembered_keys(state: Mapping) -> list[str]:
    """The widget keys whose values are kept while the user visits another page (role pickers included)."""
    keys = [K + name for name in OTHER_WIDGETS + PLAIN_FIELDS + SAMPLE_FIELDS]
    keys += [settings_key(m) for m in SETTINGS_METHODS]
    return keys + [key for key in state if str(key).startswith(K + "map_")]


def section_label(name: str) -> str:
    return SECTION_LABELS.get(name, name.replace("_", " ").capitalize())


def section_owner(name: str) -> str:
    """The method whose section holds field ``name`` (the first one listing it)."""
    return next(spec.name for spec in METHODS.values() if name in spec.section)


def choice_problems(cfg: TrainConfig) -> list[FieldError]:
    """Values a selectbox cannot show because they are not among its options (e.g. from a preset)."""
    return [FieldError(name, f"'{getattr(cfg, name)}' is not one of {', '.join(choices)}")
            for name, choices in CHOICES.items() if getattr(cfg, name) not in choices]


# ---------------------------------------------------------------------- widget values -> config
def saved_upload(state: MutableMapping, upload) -> tuple[list[str], list[FieldError]]:
    """The uploaded file saved under the data root (once per upload: its path is kept in ``state``)."""
    if upload is None:
        return [], [FieldError("local_datasets", "choose a file to upload (.jsonl, .json, .csv or .parquet)")]
    known = state.setdefault(UPLOADS, {})
    if upload.file_id not in known:
        try:
            known[upload.file_id] = str(save_upload(upload.name, upload))  # streamed: getvalue() would copy it
        except DatasetError as exc:
            return [], [FieldError(exc.field, exc.message)]
    return [known[upload.file_id]], []


def dataset_values(state: MutableMapping) -> tuple[dict, list[FieldError]]:
    """``hf_dataset``/``local_datasets`` for the chosen source; an upload is saved under the data root."""
    source = state.get(K + "dataset_source", "bundled")
    hub_id = state.get(K + "hf_dataset", "").strip()
    if source == "bundled":
        return {"hf_dataset": "", "local_datasets": [BUNDLED_DATASET]}, []
    if source == "recipe":
        chosen = state.get(K + "recipe_dataset") or ""
        errors = [] if chosen else [FieldError("local_datasets", "choose a dataset a recipe made (the Data page makes "
                                                                 "them)")]
        return {"hf_dataset": "", "local_datasets": [chosen] if chosen else []}, errors
    if source == "hub":
        errors = [] if hub_id else [FieldError("hf_dataset", "enter a hub dataset id such as org/name")]
        return {"hf_dataset": hub_id, "local_datasets": []}, errors
    if source == "local":
        files = split_list(state.get(K + "local_datasets", ""))
        errors = [] if files else [FieldError("local_datasets", "enter the path of a .jsonl/.json/.csv/.parquet file")]
        return {"hf_dataset": "", "local_datasets": files}, errors
    files, errors = saved_upload(state, state.get(K + "upload"))
    return {"hf_dataset": "", "local_datasets": files}, errors


def sample_source(state: MutableMapping) -> tuple[Path | None, str, str]:
    """(file, problem, label) the column pickers sample: the first local file; (None, "", "") for hub data."""
    dataset, _ = dataset_values(state)
    if not dataset["local_datasets"]:
        return None, "", ""
    try:
        path = resolve_source(dataset["local_datasets"][0])
    except DatasetError as exc:
        return None, exc.message, dataset["local_datasets"][0]
    return path, "", path.name


def role_mapping(state: Mapping, fmt_name: str | None) -> dict[str, str]:
    """What the role pickers of ``fmt_name`` map (a column left at its own name or unset maps nothing)."""
    mapping = {}
    slots = [key for key, _, _ in ROLE_SLOTS.get(fmt_name, [])]
    slots += list(ROLE_NAMES) if fmt_name in TURN_SLOTS else []
    for key in slots:
        chosen = state.get(f"{K}map_{fmt_name}_{key}", NOT_MAPPED)
        if chosen not in (NOT_MAPPED, key, None):
            mapping[key] = chosen
    return mapping


def current_mapping(state: Mapping) -> tuple[dict[str, str], list[FieldError]]:
    """Role pickers, then the free-text lines (which win where both name a role)."""
    typed, errors = parse_mapping(state.get(K + "custom_format_mapping", ""))
    return {**role_mapping(state, state.get(MAP_AS)), **typed}, errors


def mapped_column(state: Mapping, map_as: str) -> str:
    """The data's column that holds the turns of a chat format (its own name when not mapped)."""
    column_key = TURN_SLOTS[map_as][0]
    chosen = state.get(f"{K}map_{map_as}_{column_key}", NOT_MAPPED)
    return column_key if chosen in (NOT_MAPPED, None) else chosen


def mapped_role_key(state: Mapping, map_as: str) -> str:
    """The key inside each turn that holds the speaker's name (its own name when not mapped)."""
    role_slot = TURN_SLOTS[map_as][1]
    chosen = state.get(f"{K}map_{map_as}_{role_slot}", NOT_MAPPED)
    return role_slot if chosen in (NOT_MAPPED, None) else chosen


def speakers_chosen(state: Mapping, map_as: str) -> bool:
    """Whether any of the speaker-name pickers of a chat format maps a name other than the usual one."""
    return any(state.get(f"{K}map_{map_as}_{role}", NOT_MAPPED) not in (NOT_MAPPED, role) for role in ROLE_NAMES)


def build_config(state: MutableMapping, with_secrets: bool = True) -> tuple[TrainConfig | None, list[FieldError]]:
    """The config the form shows, and every problem found while reading the widgets."""
    values: dict[str, Any] = {name: state[K + name] for name in PLAIN_FIELDS}
    for name in STRIPPED_FIELDS:
        values[name] = values[name].strip()
    dataset, errors = dataset_values(state)
    mapping, mapping_errors = current_mapping(state)
    gpu_ids, gpu_errors = parse_gpu_ids(state.get(K + "gpu_ids", ""))
    errors = mapping_errors + errors + gpu_errors
    values.update(dataset)
    values.update(
        model_name=model_name(state[K + "model_source"], state.get(K + "model_text", ""),
                              state.get(K + "method", "sft")),
        local_eval_datasets=split_list(state.get(K + "local_eval_datasets", "")),
        custom_format_mapping=mapping,
        target_modules=list(dict.fromkeys(state[K + "target_modules"]
                                          + split_list(state.get(K + "extra_modules", "")))),
        gpu_ids=gpu_ids,
    )
    values.update(sample_values(state))
    for method in SETTINGS_METHODS:  # every method's text (a preset may fill several); only the chosen one applies
        if settings_key(method) in state:
            settings, settings_errors = settings_values(state, method)
            errors += settings_errors
            if settings is not None:
                values[method] = settings
    if with_secrets:
        values.update({name: state.get(K + name, "").strip() for name in SECRET_FIELDS})
    base = (state.get(BASE) or TrainConfig()).to_public_dict()
    try:
        cfg = TrainConfig.from_dict({**base, **values})
    except ConfigError as exc:
        return None, errors + exc.errors
    return cfg, errors


REMOTE_CODE_ADMIN_ONLY = ("only an admin may trust remote code: it runs Python from the model's repository on this "
                          "host; turn Trust remote code off, or ask an admin to start the run")


def remote_code_errors(state: Mapping, admin: bool = True) -> list[FieldError]:
    """Trust remote code needs its confirmation, and an admin (the orchestrator refuses it from anyone else too;
    the preview and prompt children that would load the code are never started for the form)."""
    if state.get(K + "trust_remote_code") and not admin:
        return [FieldError("trust_remote_code", REMOTE_CODE_ADMIN_ONLY)]
    if state.get(K + "trust_remote_code") and not state.get(K + "trust_remote_code_confirm"):
        return [FieldError("trust_remote_code", "tick 'I have read this model's code and trust its author' to run "
                                                "code from the model's repository, or turn Trust remote code off")]
    return []


def current_preview(state: Mapping, cfg: TrainConfig | None):
    """The last preview, when it was made for these settings (else None: the settings changed since)."""
    shown = state.get(PREVIEW)
    if cfg is None or shown is None or isinstance(shown[1], list) or shown[0] != config_key(cfg):
        return None
    return shown[1]


def config_key(cfg: TrainConfig) -> str:
    """What a preview depends on (the preview's own fields): a change elsewhere (learning rate, LoRA rank)
    keeps the shown preview current."""
    data = cfg.to_public_dict()
    return json.dumps({name: data.get(name) for name in PREVIEW_FIELDS}, sort_keys=True, default=str)


# ---------------------------------------------------------------------- samples during training
SAMPLE_FIELDS = ("sample_prompts", "sample_prompt_set", "sample_every_steps", "sample_max_new_tokens", "sample_images")
PROMPT_SEPARATOR = "---"  # a line holding only this separates prompts that span several lines


def prompts_text(prompts: list[str]) -> str:
    """The sample prompts as the text area shows them: one a line, or separated by '---' lines when one of
    them spans several lines (so a multi-line prompt from a preset comes back whole)."""
    if any("\n" in p for p in prompts):
        return f"\n{PROMPT_SEPARATOR}\n".join(prompts)
    return "\n".join(prompts)


def parse_prompts(text: str) -> list[str]:
    lines = text.splitlines()
    if any(line.strip() == PROMPT_SEPARATOR for line in lines):
        parts, current = [], []
        for line in lines + [PROMPT_SEPARATOR]:
            if line.strip() == PROMPT_SEPARATOR:
                parts.append("\n".join(current).strip())
                current = []
            else:
                current.append(line)
        return [p for p in parts if p]
    return [line.strip() for line in lines if line.strip()]


def sample_state(cfg: TrainConfig) -> dict[str, Any]:
    return {K + "sample_prompts": prompts_text(cfg.sample_prompts), K + "sample_prompt_set": cfg.sample_prompt_set,
            K + "sample_every_steps": cfg.sample_every_steps, K + "sample_max_new_tokens": cfg.sample_max_new_tokens,
            K + "sample_images": "\n".join(cfg.sample_images)}


def parse_images(text: str) -> list[str]:
    """One image path per line, line i for sample prompt i; an empty line is a prompt without an image (empty lines
    after the last path are dropped)."""
    lines = [line.strip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def sample_values(state: Mapping) -> dict[str, Any]:
    defaults = TrainConfig()
    base = state.get(BASE) or defaults
    text = state.get(K + "sample_prompts", "")
    # The loaded preset's own prompts while the text is as it showed them: a prompt holding a '---' line of
    # its own (a markdown rule) comes back whole, not split in two.
    prompts = list(base.sample_prompts) if text == prompts_text(base.sample_prompts) else parse_prompts(text)
    return {"sample_prompts": prompts,
            "sample_prompt_set": (state.get(K + "sample_prompt_set") or "").strip(),
            "sample_every_steps": state.get(K + "sample_every_steps", defaults.sample_every_steps),
            "sample_max_new_tokens": state.get(K + "sample_max_new_tokens", defaults.sample_max_new_tokens),
            "sample_images": parse_images(state.get(K + "sample_images", ""))}


def prompt_set_options(current: str, names: list[str]) -> list[str]:
    """"" (none), every set, and the chosen one even when it no longer exists (validation names it)."""
    return ["", *names, *([current] if current and current not in names else [])]
