"""New run: one form over TrainConfig, grouped like Unsloth Studio, advanced fields in expanders.

Defaults come from ``TrainConfig()`` and help texts from ``TrainConfig.help``, so the form never
disagrees with presets or the CLI. Validation is the config's: every problem is shown at once.
"""
from __future__ import annotations

import streamlit as st

from trainer_core import hardware
from trainer_core.config import (
    BUNDLED_DATASET,
    BUNDLED_MODEL,
    DEFAULT_TARGET_MODULES,
    FORMAT_TYPES,
    OPTIMIZERS,
    SCHEDULERS,
    TRAINING_TYPES,
    ConfigError,
    FieldError,
    TrainConfig,
    looks_like_path,
)
from trainer_core.datasets import DatasetError, save_upload
from trainer_core.orchestrator import RunRefused
from ui.entry import require_entrypoint
from ui.state import get_orchestrator

require_entrypoint("pages/new_run.py")

D = TrainConfig()
H = TrainConfig.help
K = "nr_"  # widget-key prefix; secrets live only in their own widget's state

MODEL_SOURCES = {"bundled": "Bundled (SmolLM2-135M-Instruct)", "local": "Local folder", "hub": "Hugging Face hub id"}
DATASET_SOURCES = {"bundled": "Bundled demo", "upload": "Upload a file", "local": "Local file path",
                   "hub": "Hugging Face hub dataset"}
UPLOAD_TYPES = ["jsonl", "json", "csv", "parquet"]
EXTRA_MODULES = ["embed_tokens", "lm_head"]


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


def model_name(source: str, text: str) -> str:
    text = text.strip()
    if source == "bundled":
        return BUNDLED_MODEL
    if source == "local" and text and not looks_like_path(text):
        return "./" + text  # a relative folder name must not be mistaken for a hub id
    return text


def dataset_values(source: str, upload, local_text: str, hub_id: str) -> tuple[dict, list[FieldError]]:
    """``hf_dataset``/``local_datasets`` for the chosen source; saves an upload under the data root."""
    if source == "bundled":
        return {"hf_dataset": "", "local_datasets": [BUNDLED_DATASET]}, []
    if source == "hub":
        if not hub_id.strip():
            return {"hf_dataset": "", "local_datasets": []}, [
                FieldError("hf_dataset", "enter a hub dataset id such as org/name")]
        return {"hf_dataset": hub_id.strip(), "local_datasets": []}, []
    if source == "local":
        paths = _split_list(local_text)
        errors = [] if paths else [FieldError("local_datasets", "enter the path of a .jsonl/.json/.csv/.parquet file")]
        return {"hf_dataset": "", "local_datasets": paths}, errors
    if upload is None:
        return {"hf_dataset": "", "local_datasets": []}, [
            FieldError("local_datasets", "choose a file to upload (.jsonl, .json, .csv or .parquet)")]
    try:
        saved = save_upload(upload.name, upload.getvalue())
    except DatasetError as exc:
        return {"hf_dataset": "", "local_datasets": []}, [FieldError(exc.field, exc.message)]
    return {"hf_dataset": "", "local_datasets": [str(saved)]}, []


def show_errors(errors: list[FieldError]) -> None:
    st.error(f"The run was not started: {len(errors)} problem(s) to fix.", icon="🚫")
    for error in errors:
        st.error(f"**{error.field}**: {error.message}")


st.title("New run")
if hardware.cuda_available():
    st.caption("CUDA GPU found: LoRA, QLoRA (4-bit) and full fine-tuning are available.")
else:
    st.caption("No CUDA GPU found: training runs on the CPU. QLoRA, LoftQ and 8-bit optimizers need CUDA.")

with st.form("new_run", border=False):
    st.subheader("Model")
    run_name = st.text_input("Run name", D.run_name, key=K + "run_name", help=H("run_name"),
                             placeholder="optional, e.g. smollm2-demo")
    model_source = st.radio("Model source", list(MODEL_SOURCES), format_func=MODEL_SOURCES.get, horizontal=True,
                            key=K + "model_source", help=H("model_name"))
    model_text = st.text_input("Local folder or hub id", key=K + "model_text",
                               placeholder="/path/to/hf-model-folder or org/name (not used for the bundled model)")
    col_method, col_seq = st.columns(2)
    training_type = col_method.selectbox("Method", list(TRAINING_TYPES), index=list(TRAINING_TYPES).index(D.training_type),
                                         format_func=TRAINING_TYPES.get, key=K + "training_type",
                                         help=H("training_type"))
    max_seq_length = col_seq.number_input("Max sequence length", value=D.max_seq_length, min_value=0, step=64,
                                          key=K + "max_seq_length", help=H("max_seq_length"))
    with st.expander("Access and remote code"):
        hf_token = st.text_input("Hugging Face token", type="password", key=K + "hf_token", help=H("hf_token"))
        trust_remote_code = st.checkbox("Trust remote code", D.trust_remote_code, key=K + "trust_remote_code",
                                        help=H("trust_remote_code"))
        st.caption("⚠️ Trusting remote code runs Python from the model's repository on this machine, "
                   "with your permissions. Only turn it on for authors you trust.")

    st.subheader("Dataset")
    dataset_source = st.radio("Dataset source", list(DATASET_SOURCES), format_func=DATASET_SOURCES.get,
                              horizontal=True, key=K + "dataset_source", help=H("local_datasets"))
    upload = st.file_uploader("Upload (used with 'Upload a file')", type=UPLOAD_TYPES, key=K + "upload")
    local_text = st.text_input("Local file path(s) (used with 'Local file path'; comma-separated)",
                               key=K + "local_datasets", placeholder="data/train.jsonl")
    hub_cols = st.columns(4)
    hf_dataset = hub_cols[0].text_input("Hub dataset id", D.hf_dataset, key=K + "hf_dataset", help=H("hf_dataset"),
                                        placeholder="org/name")
    subset = hub_cols[1].text_input("Subset", D.subset, key=K + "subset", help=H("subset"))
    train_split = hub_cols[2].text_input("Train split", D.train_split, key=K + "train_split", help=H("train_split"))
    eval_split = hub_cols[3].text_input("Eval split", D.eval_split, key=K + "eval_split", help=H("eval_split"))
    format_type = st.selectbox("Format", FORMAT_TYPES, index=FORMAT_TYPES.index(D.format_type), key=K + "format_type",
                               help=H("format_type"))
    with st.expander("Column mapping and system prompt"):
        mapping_text = st.text_area("Column mapping (one role=column per line)", key=K + "custom_format_mapping",
                                    help=H("custom_format_mapping"), placeholder="instruction=question\noutput=answer")
        system_prompt = st.text_area("System prompt", D.system_prompt, key=K + "system_prompt",
                                     help=H("system_prompt"))
    with st.expander("Rows and eval set"):
        row_cols = st.columns(4)
        slice_start = row_cols[0].number_input("Slice start", value=D.dataset_slice_start, min_value=0,
                                               key=K + "dataset_slice_start", help=H("dataset_slice_start"))
        slice_end = row_cols[1].number_input("Slice end", value=D.dataset_slice_end, min_value=0,
                                             key=K + "dataset_slice_end", help=H("dataset_slice_end"))
        eval_fraction = row_cols[2].number_input("Eval fraction", value=D.eval_fraction, min_value=0.0, step=0.05,
                                                 key=K + "eval_fraction", help=H("eval_fraction"))
        eval_steps = row_cols[3].number_input("Eval steps", value=D.eval_steps, min_value=0,
                                              key=K + "eval_steps", help=H("eval_steps"))
        eval_files = st.text_input("Eval files (comma-separated)", key=K + "local_eval_datasets",
                                   help=H("local_eval_datasets"))

    st.subheader("Training")
    train_cols = st.columns(4)
    num_epochs = train_cols[0].number_input("Epochs", value=D.num_epochs, min_value=0.0, step=0.5,
                                            key=K + "num_epochs", help=H("num_epochs"))
    max_steps = train_cols[1].number_input("Max steps", value=D.max_steps, min_value=0, step=10,
                                           key=K + "max_steps", help=H("max_steps"))
    learning_rate = train_cols[2].number_input("Learning rate", value=D.learning_rate, min_value=0.0, step=1e-5,
                                               format="%.2e", key=K + "learning_rate", help=H("learning_rate"))
    batch_size = train_cols[3].number_input("Batch size", value=D.batch_size, min_value=0, key=K + "batch_size",
                                            help=H("batch_size"))
    train_cols = st.columns(4)
    grad_accum = train_cols[0].number_input("Gradient accumulation", value=D.gradient_accumulation_steps,
                                            min_value=0, key=K + "gradient_accumulation_steps",
                                            help=H("gradient_accumulation_steps"))
    warmup_steps = train_cols[1].number_input("Warmup steps", value=D.warmup_steps, min_value=0,
                                              key=K + "warmup_steps", help=H("warmup_steps"))
    warmup_ratio = train_cols[2].number_input("Warmup ratio", value=D.warmup_ratio, min_value=0.0, step=0.01,
                                              key=K + "warmup_ratio", help=H("warmup_ratio"))

    with st.expander("Advanced training"):
        adv = st.columns(4)
        weight_decay = adv[0].number_input("Weight decay", value=D.weight_decay, min_value=0.0, step=0.01,
                                           key=K + "weight_decay", help=H("weight_decay"))
        max_grad_norm = adv[1].number_input("Max grad norm", value=D.max_grad_norm, min_value=0.0, step=0.1,
                                            key=K + "max_grad_norm", help=H("max_grad_norm"))
        scheduler = adv[2].selectbox("Scheduler", SCHEDULERS, index=SCHEDULERS.index(D.lr_scheduler_type),
                                     key=K + "lr_scheduler_type", help=H("lr_scheduler_type"))
        optim = adv[3].selectbox("Optimizer", OPTIMIZERS, index=OPTIMIZERS.index(D.optim), key=K + "optim",
                                 help=H("optim"))
        adv = st.columns(4)
        seed = adv[0].number_input("Seed", value=D.random_seed, key=K + "random_seed", help=H("random_seed"))
        logging_steps = adv[1].number_input("Logging steps", value=D.logging_steps, min_value=0,
                                            key=K + "logging_steps", help=H("logging_steps"))
        save_steps = adv[2].number_input("Save steps", value=D.save_steps, min_value=0, key=K + "save_steps",
                                         help=H("save_steps"))
        adv = st.columns(3)
        packing = adv[0].checkbox("Packing", D.packing, key=K + "packing", help=H("packing"))
        completions = adv[1].checkbox("Train on completions only", D.train_on_completions,
                                      key=K + "train_on_completions", help=H("train_on_completions"))
        checkpointing = adv[2].checkbox("Gradient checkpointing", D.gradient_checkpointing,
                                        key=K + "gradient_checkpointing", help=H("gradient_checkpointing"))

    with st.expander("LoRA"):
        lora = st.columns(3)
        lora_r = lora[0].number_input("Rank (r)", value=D.lora_r, min_value=0, key=K + "lora_r", help=H("lora_r"))
        lora_alpha = lora[1].number_input("Alpha", value=D.lora_alpha, min_value=0, key=K + "lora_alpha",
                                          help=H("lora_alpha"))
        lora_dropout = lora[2].number_input("Dropout", value=D.lora_dropout, min_value=0.0, step=0.05,
                                            key=K + "lora_dropout", help=H("lora_dropout"))
        target_modules = st.multiselect("Target modules", DEFAULT_TARGET_MODULES + EXTRA_MODULES,
                                        default=D.target_modules, key=K + "target_modules",
                                        help=H("target_modules") + " Clear it to pick modules with the switches below.")
        extra_modules = st.text_input("More target modules (comma-separated)", key=K + "extra_modules")
        lora = st.columns(5)
        use_rslora = lora[0].checkbox("rsLoRA", D.use_rslora, key=K + "use_rslora", help=H("use_rslora"))
        use_loftq = lora[1].checkbox("LoftQ", D.use_loftq, key=K + "use_loftq", help=H("use_loftq"))
        attention = lora[2].checkbox("Attention modules", D.finetune_attention_modules,
                                     key=K + "finetune_attention_modules", help=H("finetune_attention_modules"))
        mlp = lora[3].checkbox("MLP modules", D.finetune_mlp_modules, key=K + "finetune_mlp_modules",
                               help=H("finetune_mlp_modules"))
        language = lora[4].checkbox("Language layers", D.finetune_language_layers,
                                    key=K + "finetune_language_layers", help=H("finetune_language_layers"))

    with st.expander("Logging"):
        log_cols = st.columns(3)
        enable_wandb = log_cols[0].toggle("Weights & Biases", D.enable_wandb, key=K + "enable_wandb",
                                          help=H("enable_wandb"))
        wandb_project = log_cols[1].text_input("W&B project", D.wandb_project, key=K + "wandb_project",
                                               help=H("wandb_project"))
        wandb_token = log_cols[2].text_input("W&B API key", type="password", key=K + "wandb_token",
                                             help=H("wandb_token"))
        enable_tensorboard = st.toggle("TensorBoard", D.enable_tensorboard, key=K + "enable_tensorboard",
                                       help=H("enable_tensorboard"))

    submitted = st.form_submit_button("Start training", type="primary", icon="🚀")

if submitted:
    orch = get_orchestrator()
    mapping, errors = parse_mapping(mapping_text)
    dataset, dataset_errors = dataset_values(dataset_source, upload, local_text, hf_dataset)
    errors += dataset_errors
    values = {
        "run_name": run_name.strip(),
        "model_name": model_name(model_source, model_text),
        "training_type": training_type,
        "max_seq_length": max_seq_length,
        "trust_remote_code": trust_remote_code,
        "hf_token": hf_token.strip(),
        **dataset,
        "local_eval_datasets": _split_list(eval_files),
        "format_type": format_type,
        "subset": subset.strip(),
        "train_split": train_split.strip(),
        "eval_split": eval_split.strip(),
        "eval_fraction": eval_fraction,
        "eval_steps": eval_steps,
        "dataset_slice_start": slice_start,
        "dataset_slice_end": slice_end,
        "custom_format_mapping": mapping,
        "system_prompt": system_prompt,
        "num_epochs": num_epochs,
        "max_steps": max_steps,
        "learning_rate": learning_rate,
        "batch_size": batch_size,
        "gradient_accumulation_steps": grad_accum,
        "warmup_steps": warmup_steps,
        "warmup_ratio": warmup_ratio,
        "weight_decay": weight_decay,
        "max_grad_norm": max_grad_norm,
        "lr_scheduler_type": scheduler,
        "optim": optim,
        "random_seed": seed,
        "packing": packing,
        "train_on_completions": completions,
        "gradient_checkpointing": checkpointing,
        "logging_steps": logging_steps,
        "save_steps": save_steps,
        "lora_r": lora_r,
        "lora_alpha": lora_alpha,
        "lora_dropout": lora_dropout,
        "target_modules": list(dict.fromkeys(target_modules + _split_list(extra_modules))),
        "use_rslora": use_rslora,
        "use_loftq": use_loftq,
        "finetune_attention_modules": attention,
        "finetune_mlp_modules": mlp,
        "finetune_language_layers": language,
        "enable_wandb": enable_wandb,
        "wandb_project": wandb_project.strip(),
        "wandb_token": wandb_token.strip(),
        "enable_tensorboard": enable_tensorboard,
    }
    try:
        cfg = TrainConfig.from_dict(values)
    except ConfigError as exc:
        cfg = None
        errors += exc.errors
    if cfg is not None and errors:
        # Report the rest of the form too, so one submit shows every problem.
        reported = {e.field for e in errors}
        errors += [e for e in orch.validate(cfg) if e.field not in reported]
    if errors:
        show_errors(errors)
    else:
        try:
            run_id = orch.start(cfg)
        except ConfigError as exc:
            show_errors(exc.errors)
        except RunRefused as exc:
            st.warning(str(exc), icon="⏳")
        else:
            st.session_state["live_run_id"] = run_id
            st.switch_page("pages/live.py")
