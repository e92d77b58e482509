"""A create-job request (OpenAI's ``fine_tuning.jobs.create`` body) read into the studio's TrainConfig.

OpenAI's fields map onto the run's: ``model`` -> model_name (a previous job's ``fine_tuned_model``: the start its
caller resolved, ``StartPoint``), ``training_file``/``validation_file`` -> the uploaded files, ``hyperparameters``
(top level, or under ``method.<type>``) -> num_epochs, batch_size and the learning rate (the studio's default times
``learning_rate_multiplier``), ``method.dpo.hyperparameters.beta`` -> dpo.beta, ``method.reinforcement`` -> a GRPO
run (reinforcement.py), ``seed`` -> random_seed, ``suffix`` -> the run's name and the fine-tuned model's name.
``"auto"`` takes the studio's defaults (3 epochs, its batch size and learning rate, DPO's beta). The extension field
``studio`` takes any other run setting by its config name (docs/config-reference.md), e.g. ``{"max_steps": 20,
"lora_r": 8}``. Every problem is an ApiError naming the request parameter.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, Iterable

from trainer_core.api import files, graders, models, reinforcement
from trainer_core.api.datafile import SHAPES
from trainer_core.api.errors import ApiError, invalid, unsupported
from trainer_core.config import ConfigError, FieldError, TrainConfig
from trainer_core.methods.grpo_settings import GRPOSettings
from trainer_core.protocol.secrets import SECRET_FIELDS

KNOWN = {"model", "training_file", "validation_file", "hyperparameters", "method", "suffix", "seed", "metadata",
         "integrations", "studio"}
AUTO_EPOCHS = 3
RANGES = {"n_epochs": (1, 50), "batch_size": (1, 256), "learning_rate_multiplier": (0.0, 10.0), "beta": (0.0, 2.0)}
# OpenAI's method -> (the studio's method, the file shapes it trains on, its own hyperparameters)
METHODS = {"supervised": ("sft", ("chat",), ()), "dpo": ("dpo", ("pairs",), ("beta",)),
           "reinforcement": ("grpo", ("prompts", "chat"), reinforcement.HYPERPARAMETERS)}
# Settings only the request names, in OpenAI's terms: the extension may not set them.
OWNED = {"model_name": "model", "init_adapter": "model", "local_datasets": "training_file",
         "local_eval_datasets": "validation_file", "hf_dataset": "training_file", "method": "method",
         "run_name": "suffix", "dpo": "method.dpo.hyperparameters"}
# Settings the extension may set when the request leaves their OpenAI counterpart out (or "auto"); a problem with
# one is named after that counterpart.
SHARED = {"num_epochs": "hyperparameters.n_epochs", "max_steps": "hyperparameters.n_epochs",
          "batch_size": "hyperparameters.batch_size", "learning_rate": "hyperparameters.learning_rate_multiplier",
          "random_seed": "seed"}
_SUFFIX_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass
class JobRequest:
    """What the API keeps of a request besides the run's config."""

    model: str
    training_file: str
    validation_file: str | None
    suffix: str
    seed: int
    metadata: dict[str, str]
    method: str  # supervised, dpo or reinforcement
    hyperparameters: dict[str, Any] = field(default_factory=dict)  # as resolved (no "auto" left)
    beta: float | None = None
    studio: list[str] = field(default_factory=list)  # the run settings the extension field set
    grader: dict | None = None  # reinforcement: the grader as given
    notes: list[str] = field(default_factory=list)  # what the job accepted but ignored (shown in its events)


@dataclass
class StartPoint:
    """Where a job whose ``model`` is a previous job's fine-tuned model starts (jobs.start_point finds it)."""

    model_name: str  # the run's model_name: the base under the adapter, or the saved full model's folder
    base_model: str  # the first job's base model, which the new fine-tuned model is named after
    settings: dict[str, Any] = field(default_factory=dict)  # init_adapter and the adapter's LoRA fields


def read(body: object, start: StartPoint | None = None) -> tuple[JobRequest, TrainConfig]:
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", None)
    for name in body:
        if name not in KNOWN:
            raise invalid(f"Unrecognized request argument supplied: {name}", str(name)[:100])
    if body.get("integrations"):
        raise unsupported("integrations (Weights & Biases) are not supported through this API: set enable_wandb in "
                          "the studio extension field and WANDB_API_KEY in the server's environment", "integrations")
    model_name = start.model_name if start is not None else models.base_model(body.get("model"))
    method, section, hyper, own = _method(body)
    shapes = METHODS[method][1]
    training = _file(body.get("training_file"), "training_file", shapes)
    validation = _file(body["validation_file"], "validation_file", shapes) if body.get("validation_file") else None
    suffix = body.get("suffix") or ""
    if not isinstance(suffix, str) or (suffix and not _SUFFIX_RE.match(suffix)):
        raise invalid("suffix: up to 64 letters, digits, '.', '_' or '-' (it becomes part of the model's name)", "suffix")
    metadata = _metadata(body.get("metadata"))
    studio = _studio(body.get("studio"))
    defaults = TrainConfig()
    seed = body.get("seed")
    if seed is None:
        seed = studio.get("random_seed", defaults.random_seed)
    elif type(seed) is not int or not 0 <= seed <= 2**31 - 1:
        raise invalid("seed must be an integer from 0 to 2147483647", "seed")
    elif "random_seed" in studio:
        raise invalid("seed and studio.random_seed both set it: give one", "seed")
    epochs = _number(hyper, "n_epochs", int)
    batch = _number(hyper, "batch_size", int)
    multiplier = _number(hyper, "learning_rate_multiplier", float)
    beta = _number({"beta": own.get("beta")}, "beta", float, "method.dpo.hyperparameters.beta")
    plan = reinforcement.plan(section, own, studio) if method == "reinforcement" else None
    if plan is not None:
        reinforcement.check_fields(plan, training.columns, training.id, "training_file")
        if validation is not None:
            reinforcement.check_fields(plan, validation.columns, validation.id, "validation_file")
    for name, value in (("n_epochs", epochs), ("batch_size", batch), ("learning_rate_multiplier", multiplier)):
        clash = {"n_epochs": ("num_epochs", "max_steps"), "batch_size": ("batch_size",),
                 "learning_rate_multiplier": ("learning_rate",)}[name]
        if value is not None and any(k in studio for k in clash):
            raise invalid(f"hyperparameters.{name} and studio.{'/'.join(k for k in clash if k in studio)} both set it: "
                          "give one", f"hyperparameters.{name}")
    config: dict[str, Any] = {**(start.settings if start is not None else {}), **studio, "model_name": model_name,
                              "method": METHODS[method][0],
                              "local_datasets": [str(training.training_path)],
                              "local_eval_datasets": [str(validation.training_path)] if validation else [],
                              "random_seed": seed, "run_name": suffix or "API job"}
    if epochs is not None or "max_steps" not in studio:
        config.update(num_epochs=float(epochs or studio.get("num_epochs", AUTO_EPOCHS)), max_steps=0)
    generations = plan.grpo.get("num_generations", GRPOSettings().num_generations) if plan is not None else 1
    if batch is not None or (plan is not None and "batch_size" not in studio):
        # reinforcement: OpenAI's batch counts prompts ("auto": one), the run's counts their completions
        config["batch_size"] = (batch or 1) * generations
    base_lr = float(studio.get("learning_rate", defaults.learning_rate))
    config["learning_rate"] = base_lr * (multiplier if multiplier is not None else 1.0)
    if method == "dpo" and beta is not None:
        config["dpo"] = {"beta": beta}
    if plan is not None:
        config.update(plan.config, grpo=plan.grpo)
    cfg = from_dict(config, studio)
    resolved = {"n_epochs": int(cfg.num_epochs) if cfg.max_steps == 0 else "auto",
                "batch_size": max(1, cfg.batch_size // generations),
                "learning_rate_multiplier": multiplier if multiplier is not None else 1.0}
    if plan is not None:
        resolved.update(plan.hyperparameters, eval_interval=cfg.eval_steps)
    request = JobRequest(model=str(body["model"]), training_file=training.id,
                         validation_file=validation.id if validation else None, suffix=suffix, seed=seed,
                         metadata=metadata, method=method, hyperparameters=resolved, beta=beta,
                         studio=sorted(studio), grader=section.get("grader") if plan is not None else None,
                         notes=plan.notes if plan is not None else [])
    return request, cfg


def _method(body: dict) -> tuple[str, dict, dict, dict]:
    """(method type, its section, its hyperparameters, those only this method has) as given."""
    method = body.get("method")
    top = body.get("hyperparameters")
    if top is not None and not isinstance(top, dict):
        raise invalid("hyperparameters must be an object", "hyperparameters")
    if method is not None and not isinstance(method, dict):
        raise invalid("method must be an object such as {\"type\": \"supervised\"}", "method")
    kind = method.get("type") if method is not None else "supervised"
    if kind not in METHODS:
        raise invalid(f"method.type must be one of {', '.join(METHODS)}, not {str(kind)[:40]!r}", "method.type")
    section = (method.get(kind) if method is not None else None) or {}
    if not isinstance(section, dict):
        raise invalid(f"method.{kind} must be an object", f"method.{kind}")
    hyper = section.get("hyperparameters") or {}
    if not isinstance(hyper, dict):
        raise invalid(f"method.{kind}.hyperparameters must be an object", f"method.{kind}.hyperparameters")
    if hyper and top:
        raise invalid("give hyperparameters either at the top level or under method, not both", "hyperparameters")
    where = f"method.{kind}.hyperparameters" if hyper else "hyperparameters"
    hyper = dict(hyper or top or {})
    own = {}
    for other, (_, _, names) in METHODS.items():
        for name in names:
            if name in hyper and other != kind:
                raise invalid(f"{name} is a {other} hyperparameter", f"{where}.{name}")
            if name in hyper:
                own[name] = hyper.pop(name)
    return kind, section, hyper, own


def _number(hyper: dict, name: str, kind: type, param: str = "") -> float | int | None:
    """A hyperparameter's value, None for "auto" or absent; out of range or of the wrong type: an ApiError."""
    param = param or f"hyperparameters.{name}"
    unknown = [k for k in hyper if k not in RANGES]
    if unknown:
        raise invalid(f"unknown hyperparameter {unknown[0]!r}: use n_epochs, batch_size, learning_rate_multiplier "
                      f"(and beta for dpo; {', '.join(reinforcement.HYPERPARAMETERS)} for reinforcement)",
                      f"hyperparameters.{unknown[0]}")
    value = hyper.get(name)
    if value is None or value == "auto":
        return None
    low, high = RANGES[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise invalid(f"{name} must be {'an integer' if kind is int else 'a number'} or \"auto\", not {value!r}", param)
    low_ok = value > low if kind is float else value >= low
    if not low_ok or value > high:
        bound = f"greater than {low}" if kind is float else f"at least {low}"
        raise invalid(f"{name} must be {bound} and at most {high}; got {value}", param)
    return kind(value)


def _file(file_id: object, param: str, shapes: tuple[str, ...]) -> files.StoredFile:
    """The uploaded file ``file_id``, of one of the ``shapes`` the method trains on (the first is its own; chat rows
    serve reinforcement when they are messages: their last answer is the row's ``answer`` field)."""
    if not isinstance(file_id, str) or not file_id:
        raise invalid(f"{param} is required: the id of a file uploaded with purpose 'fine-tune'", param)
    stored = files.get(file_id, param)
    if stored.purpose != files.PURPOSE:
        raise invalid(f"{file_id} has purpose {stored.purpose!r}; fine-tuning needs a file with purpose 'fine-tune'",
                      param)
    if stored.shape not in shapes or (stored.shape != shapes[0] and stored.columns is None):
        layout = f" in the {stored.format} layout" if stored.shape in shapes else ""
        raise invalid(f"{file_id} holds {SHAPES[stored.shape]}{layout}, but this method trains on {SHAPES[shapes[0]]}",
                      param)
    return stored


def _metadata(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 16:
        raise invalid("metadata must be an object of at most 16 keys", "metadata")
    for key, item in value.items():
        if not isinstance(item, str) or len(key) > 64 or len(item) > 512:
            raise invalid("metadata: keys of at most 64 characters, string values of at most 512", "metadata")
    return dict(value)


def _studio(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid("studio must be an object of run settings (docs/config-reference.md)", "studio")
    for key in value:
        if key in OWNED:
            raise invalid(f"studio.{key} is set by {OWNED[key]} in this API", f"studio.{key}")
        if key in SECRET_FIELDS:
            raise invalid(f"studio.{key}: secrets are never sent in a request; set them in the server's environment",
                          f"studio.{key}")
    return dict(value)


def param_of(error: FieldError, studio: Iterable[str] = ()) -> str | None:
    """The request parameter a config problem is fixed in (``studio``: the fields the extension set)."""
    if error.field in studio:
        return f"studio.{error.field}"
    if error.field.startswith("grpo.rewards"):
        return graders.PARAM
    if error.field.startswith("grpo."):
        return f"studio.{error.field}"
    if error.field in OWNED or error.field in SHARED:
        return OWNED.get(error.field) or SHARED[error.field]
    known = {f.name for f in fields(TrainConfig)}
    return f"studio.{error.field}" if error.field in known else None


def config_error(exc: ConfigError, request_files: dict[str, str] | None = None, studio: Iterable[str] = ()) -> ApiError:
    """Every problem of a config in one error, named after the first one's parameter; the server's paths of the
    request's files are shown as their ids."""
    studio = set(studio)
    message = "; ".join(f"{param_of(e, studio) or e.field}: {e.message}" for e in exc.errors)
    for path, file_id in (request_files or {}).items():
        message = message.replace(path, file_id)
    return invalid(message, param_of(exc.errors[0], studio) if exc.errors else None)


def from_dict(config: dict[str, Any], studio: Iterable[str]) -> TrainConfig:
    try:
        return TrainConfig.from_dict(config)
    except ConfigError as exc:
        raise config_error(exc, studio=studio) from None


__all__ = ["ApiError", "JobRequest", "read", "config_error"]
