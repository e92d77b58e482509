"""The one typed run configuration (trainer_core.config): its fields with their defaults and help texts, and how it is
built from loose input, written out without secrets, and checked."""
from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from trainer_core import methods
from trainer_core.methods import embedding
from trainer_core.protocol.errors import ConfigError, FieldError
from trainer_core.protocol.secrets import SECRET_FIELDS
from trainer_core.config.limits import (ATTENTION_MODULES, BUNDLED_DATASET, BUNDLED_MODEL, CONFIG_BYTES_MAX,
                                        DEFAULT_TARGET_MODULES, MLP_MODULES, RAY_ADDRESSES_ENV, RAY_ADDRESS_ENV,
                                        RAY_MAX_FAILURES, SHARED_STORAGE_ENV)
from trainer_core.config.reading import (_coerce, _flatten_sections, load_yaml, read_is_embedding,
                                         read_method_settings, read_training_type, settings_for,
                                         take_settings_sections)
from trainer_core.config import checks

def _f(default: Any, help: str, group: str = "basic", secret: bool = False, whole_items: bool = False,
       **kw: Any) -> Any:
    # whole_items: a list field whose items are free text (prompts): a string is one item, never split at commas
    meta = {"help": help, "group": group, "secret": secret, "whole_items": whole_items}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


@dataclass
class TrainConfig:
    # --- run ---
    run_name: str = _f("", "A name for the run shown in History (letters, digits, spaces, - _ . only).")
    # --- model ---
    model_name: str = _f(BUNDLED_MODEL, "Bundled model, a local Hugging Face folder, or a hub id like org/name.", "model")
    method: str = _f(methods.DEFAULT_METHOD, "What the run learns: sft (supervised fine-tuning on chat or text) or "
                     "cpt (continued pretraining on raw text). See trainer_core.methods.", "model")
    adapter: str = _f(methods.DEFAULT_ADAPTER, "What is trained: lora (adapters on a frozen base), qlora (LoRA on a "
                      "4-bit base, CUDA only) or full (every weight).", "model")
    load_in_4bit: bool = _f(False, "Load the base model in 4-bit (bitsandbytes; CUDA only). Implied by qlora.", "model")
    max_seq_length: int = _f(512, "Longest sequence in tokens; longer rows are truncated.", "model")
    trust_remote_code: bool = _f(False, "Run code shipped with a hub model. Off unless you trust its author.", "model")
    hf_token: str = _f("", "Hugging Face token for gated models/datasets. Never stored. Not for launcher: ray (Ray "
                       "shows a job's environment): the cluster's nodes use their own Hugging Face credentials.",
                       "model", secret=True)
    gpu_ids: list = _f([], "GPU indices to use (empty: all visible). Ignored on CPU.", "model")
    num_processes: int = _f(0, "Data-parallel processes (torchrun): 0 means one per GPU of the run's GPUs, or 1 on CPU. "
                            "On CPU 2 or more runs the same launcher with the gloo backend.", "model")
    launcher: str = _f("local", "Where the worker runs: local (this host; torchrun for several processes) or ray (a Ray "
                       "cluster: a Ray job, Ray Train's TorchTrainer with num_processes workers; run folders on "
                       f"{SHARED_STORAGE_ENV}). See docs/ray.md.", "model")
    ray_address: str = _f("", "The Ray cluster's dashboard address for launcher: ray (empty: the server's cluster, "
                          f"{RAY_ADDRESS_ENV}). Another address must be in the server's {RAY_ADDRESSES_ENV}.", "model")
    ray_gpus_per_worker: float = _f(0.0, "GPUs per Ray worker for launcher: ray (0: CPU workers, gloo).", "model")
    ray_max_failures: int = _f(0, "For launcher: ray with several workers: how many times Ray Train restarts the "
                               "workers when one of them or its node is lost, each time resuming from the run's latest "
                               f"checkpoint (Ray Train's FailureConfig; 0: the run fails naming the rank and node; at "
                               f"most {RAY_MAX_FAILURES}). See docs/ray.md, Losing a node.", "model")
    # --- dataset ---
    hf_dataset: str = _f("", "Hub dataset id (org/name). Leave empty to use local files.", "dataset")
    local_datasets: list = _f([BUNDLED_DATASET], "Local dataset files (.jsonl/.json/.csv/.parquet) or the bundled demo.", "dataset")
    local_eval_datasets: list = _f([], "Local files used as the eval set.", "dataset")
    format_type: str = _f("auto", "auto, alpaca, chatml (messages; also with tool calls), sharegpt (also with "
                          "function_call/observation turns), xlam (query, tools, answers: tool calls), or text (raw). "
                          "See docs/data-formats.md.", "dataset")
    subset: str = _f("", "Hub dataset subset (configuration) name.", "dataset")
    train_split: str = _f("train", "Hub dataset split to train on.", "dataset")
    eval_split: str = _f("", "Hub dataset split to evaluate on (empty: none, or use eval_fraction).", "dataset")
    eval_fraction: float = _f(0.0, "Hold out this fraction of the training rows as an eval set (fixed seed).", "dataset")
    eval_steps: int = _f(20, "Evaluate every N steps when an eval set exists.", "dataset")
    early_stopping_patience: int = _f(0, "Stop when eval loss has not improved for N evaluations in a row (0: off; needs an eval set).", "dataset")
    dataset_slice_start: int = _f(0, "First row to use (0-based).", "dataset")
    dataset_slice_end: int = _f(0, "Row after the last to use (0: to the end).", "dataset")
    custom_format_mapping: dict = _f({}, "Map your column names onto the format's roles, e.g. {instruction: question}.", "dataset")
    system_prompt: str = _f("", "Optional system prompt added to every conversation.", "dataset")
    is_dataset_image: bool = _f(False, "Require images: image + text rows are detected without it (docs/vision.md); "
                                "on, a dataset without images is refused.", "dataset")
    image_max_side: int = _f(0, "Images longer than this on their longest side (px) are scaled down, keeping their "
                             "shape, before the processor sees them (Unsloth's resize); 0: as they are. Fewer pixels "
                             "mean fewer tokens per image where the count grows with the image (Qwen-VL, Pixtral, "
                             "tiled models); fixed-size towers resize to their own size anyway.", "dataset")
    is_dataset_audio: bool = _f(False, "Audio dataset: speech clips and transcripts, trained with method stt "
                                "(docs/speech.md).", "dataset")
    # --- training ---
    num_epochs: float = _f(1.0, "Passes over the data; ignored when max_steps > 0.", "training")
    max_steps: int = _f(60, "Stop after this many optimizer steps (0: use num_epochs).", "training")
    learning_rate: float = _f(2e-4, "Peak learning rate.", "training")
    embedding_learning_rate: float = _f(0.0, "Learning rate for embeddings/lm_head in continued pretraining (0: same as learning_rate).", "training")
    batch_size: int = _f(4, "Rows per device per step.", "training")
    gradient_accumulation_steps: int = _f(1, "Steps to accumulate before an optimizer update.", "training")
    warmup_steps: int = _f(5, "Linear warmup steps (use this or warmup_ratio).", "training")
    warmup_ratio: float = _f(0.0, "Warmup as a fraction of total steps (use this or warmup_steps).", "training")
    weight_decay: float = _f(0.01, "AdamW weight decay.", "advanced")
    max_grad_norm: float = _f(1.0, "Clip gradients to this norm (0: no clipping).", "advanced")
    lr_scheduler_type: str = _f("linear", "Learning-rate schedule.", "advanced")
    optim: str = _f("adamw_torch", "Optimizer.", "advanced")
    random_seed: int = _f(3407, "Seed for data order, LoRA init and held-out split.", "advanced")
    packing: bool = _f(False, "Pack short rows into full-length sequences.", "advanced")
    train_on_completions: bool = _f(False, "Compute loss only on assistant replies (chat formats).", "advanced")
    tool_template: str = _f("auto", "Chat template for conversations with tools: auto (the model's own when it writes "
                            "the tools into the prompt, else the Hermes tool template), model (the model's own; refused "
                            "when it ignores tools) or hermes (tools in the system prompt inside <tools></tools>, calls "
                            "as <tool_call> JSON, results as <tool_response>). Saved with the adapter and merged model. "
                            "Data without tools keeps the model's template.", "advanced")
    train_on_tool_results: bool = _f(False, "Conversations with tools train on the assistant's calls and answers; on: "
                                     "also on the tool results (off: the model learns to call, not to predict what a "
                                     "tool returns).", "advanced")
    gradient_checkpointing: bool = _f(False, "Trade compute for memory.", "advanced")
    logging_steps: int = _f(1, "Log metrics every N steps.", "advanced")
    save_steps: int = _f(0, "Save a checkpoint every N steps (0: only at the end or on Stop).", "advanced")
    resume_from_checkpoint: str = _f("", "A checkpoint folder under the runs folder to resume from.", "advanced")
    allow_memory_overcommit: bool = _f(False, "Start even when the memory estimate is more than twice the device's "
                                       "memory (the estimate is rough; for those who know better).", "advanced")
    # --- LoRA ---
    use_lora: bool = _f(True, "Train LoRA adapters instead of all weights (implied by lora/qlora, off for full).", "lora")
    lora_r: int = _f(16, "LoRA rank.", "lora")
    lora_alpha: int = _f(32, "LoRA alpha (scaling).", "lora")
    lora_dropout: float = _f(0.0, "LoRA dropout.", "lora")
    target_modules: list = _f(list(DEFAULT_TARGET_MODULES), "Module names to adapt (empty: from the attention/MLP switches).", "lora")
    use_rslora: bool = _f(False, "Rank-stabilised LoRA scaling.", "lora")
    init_adapter: str = _f("", "A LoRA adapter folder this run starts from instead of new adapters: a finished run's "
                           "adapter/ or one of its checkpoints (under the allowed folders). model_name must be the "
                           "base it was trained on, lora_r and lora_alpha its own; its target modules are kept. "
                           "Trained with the transformers engine (Unsloth starts new adapters only).", "lora")
    use_loftq: bool = _f(False, "LoftQ initialisation of the adapters from a 16-bit base (CUDA and bitsandbytes; "
                         "not with 4-bit loading).", "lora")
    finetune_vision_layers: bool = _f(False, "Adapt the vision tower and its projector too (vision-language models; "
                                      "the attention/MLP switches pick the tower's layers).", "lora")
    finetune_language_layers: bool = _f(True, "Adapt language layers.", "lora")
    finetune_attention_modules: bool = _f(True, "Adapt attention projections.", "lora")
    finetune_mlp_modules: bool = _f(True, "Adapt MLP projections.", "lora")
    # --- logging ---
    enable_wandb: bool = _f(False, "Report to Weights & Biases (pip install wandb).", "logging")
    wandb_token: str = _f("", "W&B API key. Never stored. Not for launcher: ray: the cluster's nodes use their own "
                          "W&B login.", "logging", secret=True)
    wandb_project: str = _f("finetune-studio", "W&B project name.", "logging")
    enable_tensorboard: bool = _f(False, "Write TensorBoard logs (pip install tensorboard).", "logging")
    tensorboard_dir: str = _f("tensorboard", "TensorBoard folder, relative to the run folder.", "logging")
    # --- samples during training ---
    sample_prompts: list = _f([], "Prompts the model answers while it trains (greedy, fixed seed), at most 8 of "
                              "at most 2,000 characters each; shown on Live and Run details.", "samples",
                              whole_items=True)
    sample_prompt_set: str = _f("", "A saved or built-in prompt set to sample instead of sample_prompts "
                                "(e.g. quick-check).", "samples")
    sample_every_steps: int = _f(0, "Sample every N steps. 0: at each evaluation, or at each checkpoint save when "
                                 "the run has no eval set; always once at the end.", "samples")
    sample_max_new_tokens: int = _f(64, "Longest answer per sample prompt, in new tokens (bounds the time "
                                    "sampling takes).", "samples")
    sample_images: list = _f([], "A vision run's sample prompts shown with an image: image i goes with sample "
                             "prompt i (\"\" for a text-only prompt), files under the allowed folders; the image "
                             "shows above the answers.", "samples")
    # --- the method's own settings: one typed object, whatever the method (a new method adds no field here) ---
    method_settings: Any = _f(None, "The method's own settings, a dataclass its spec names (DPOSettings for dpo, "
                              "GRPOSettings for grpo...; None for sft and cpt), built when the config is read from "
                              "the YAML section named after the method, e.g. dpo: {beta: 0.1, loss_type: sigmoid} "
                              "(docs/methods.md lists every setting).", "method")

    def __post_init__(self) -> None:
        # a config whose method changed (dataclasses.replace) holds the new method's defaults
        self.method_settings = settings_for(self.method, self.method_settings)

    # ------------------------------------------------------------------ helpers
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def help(cls, name: str) -> str:
        return {f.name: f.metadata["help"] for f in fields(cls)}[name]

    @property
    def method_spec(self) -> methods.MethodSpec:
        return methods.get(self.method)

    @property
    def method_label(self) -> str:
        return methods.run_label(self.method, self.adapter)

    @property
    def effective_use_lora(self) -> bool:
        return self.adapter != "full"

    @property
    def effective_4bit(self) -> bool:
        return self.adapter == "qlora" or self.load_in_4bit

    @property
    def effective_target_modules(self) -> list[str]:
        if self.target_modules:
            return list(self.target_modules)
        modules: list[str] = []
        if self.finetune_attention_modules:
            modules += ATTENTION_MODULES
        if self.finetune_mlp_modules:
            modules += MLP_MODULES
        return modules

    @property
    def has_eval_set(self) -> bool:
        if self.hf_dataset:
            return bool(self.eval_split) or self.eval_fraction > 0
        return bool(self.local_eval_datasets) or self.eval_fraction > 0

    @property
    def dataset_label(self) -> str:
        if self.hf_dataset:
            return self.hf_dataset + (f" [{self.subset}]" if self.subset else "")
        return ", ".join(_data_label(p) for p in self.local_datasets)

    @property
    def model_label(self) -> str:
        if self.model_name == BUNDLED_MODEL:
            return "SmolLM2-135M-Instruct (bundled)"
        if self.model_name == embedding.BUNDLED_MODEL:
            return "all-MiniLM-L6-v2 (bundled)"
        return self.model_name

    def secrets(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in SECRET_FIELDS if getattr(self, name)}

    def without_secrets(self) -> "TrainConfig":
        return dataclasses.replace(self, **{name: "" for name in SECRET_FIELDS})

    def to_dict(self) -> dict[str, Any]:
        """Every field; the method's settings as the section named after the method (``dpo: {beta: 0.1, ...}``),
        as YAML files and older run folders hold them."""
        data = dataclasses.asdict(self)
        settings = data.pop("method_settings")
        if settings is not None:
            data[self.method] = settings
        return data

    def to_public_dict(self) -> dict[str, Any]:
        data = self.to_dict()
        for name in SECRET_FIELDS:
            data.pop(name, None)
        return data

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_public_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        """Build from loose input (YAML, form, JSON). Unknown keys and wrong types raise ConfigError."""
        if not isinstance(data, dict):
            raise ConfigError([FieldError("config", "expected a mapping of field names to values")])
        known = {f.name: f for f in fields(cls) if f.name != "method_settings"}  # written as its method's section
        errors: list[FieldError] = []
        values: dict[str, Any] = {}
        data = _flatten_sections(data, errors)
        if "training_type" in data:  # the deprecated fields: read here as what they mean, never kept
            data = read_training_type(data, errors)
        if "is_embedding" in data:
            data = read_is_embedding(data, errors)
        data, sections = take_settings_sections(data, errors)
        for key, raw in data.items():
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" Did you mean '{close[0]}'?" if close else " Remove it."
                errors.append(FieldError(str(key), f"unknown field.{hint}"))
                continue
            try:
                values[key] = _coerce(known[key], raw)
            except (TypeError, ValueError) as exc:
                errors.append(FieldError(key, str(exc)))
        method = values.get("method", methods.DEFAULT_METHOD)
        values["method_settings"], problems = read_method_settings(method, sections.get(method))
        errors += problems
        if errors:
            raise ConfigError(errors)
        return cls(**values)

    @classmethod
    def from_yaml(cls, text: str) -> "TrainConfig":
        if len(text) > CONFIG_BYTES_MAX:
            raise ConfigError([FieldError("config", f"{len(text):,} characters is larger than a config can be "
                                                    f"({CONFIG_BYTES_MAX:,}): keep only the fields you set")])
        try:
            data = load_yaml(text) or {}
        except (yaml.YAMLError, RecursionError) as exc:
            raise ConfigError([FieldError("config", f"not valid YAML: {exc}")]) from None
        return cls.from_dict(data)

    @classmethod
    def read_text(cls, path: str | Path, field_name: str = "config") -> str:
        """A config file's text, refused before it is read when it is larger than ``CONFIG_BYTES_MAX``
        (``OSError`` and ``UnicodeDecodeError`` reach the caller, which names the file its own way)."""
        size = Path(path).stat().st_size
        if size > CONFIG_BYTES_MAX:
            raise ConfigError([FieldError(field_name, f"{path} is {size:,} bytes, larger than a config can be "
                                                      f"({CONFIG_BYTES_MAX:,}): keep only the fields you set")])
        return Path(path).read_text(encoding="utf-8")

    # ------------------------------------------------------------------ validation
    def validate(self) -> list[FieldError]:
        """Every problem with this config's fields, each naming its field and the fix (config.checks.validate)."""
        return checks.validate(self)

    def check(self) -> "TrainConfig":
        errors = self.validate()
        if errors:
            raise ConfigError(errors)
        return self


RECIPE_DATA = re.compile(r"(?:^|/)recipes/([a-z0-9][a-z0-9_-]{0,63})/v(\d{1,6})/data\.jsonl$")


def _data_label(path: str) -> str:
    """A dataset file as History shows it: its name; a recipe's dataset version as name@vN (so History's search
    finds the runs trained on it: trainer_core/recipes/store.py)."""
    if path.startswith("bundled:"):
        return path
    found = RECIPE_DATA.search(path.replace("\\", "/"))
    return f"{found.group(1)}@v{found.group(2)}" if found else Path(path).name

