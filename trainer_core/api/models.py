"""Model names of the API: which base models a job may start from, and the names of fine-tuned models.

A finished job's model is ``ft:<base>:<suffix>:<job id>``, a checkpoint's the same with ``:ckpt-step-<N>``
(OpenAI's own pattern); both are read back into the studio's model sources (``specs.model_source.ModelSource``), which a
serve job loads. A base model is the bundled one (by any of its names), a model folder under the allowed roots, or
a hub model already in this host's hub cache (the server does not download models a request names).
"""
from __future__ import annotations

import re

from huggingface_hub import try_to_load_from_cache

from trainer_core.api.errors import ApiError, invalid
from trainer_core.config import BUNDLED_MODEL
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import paths

BUNDLED_MODEL_NAME = "SmolLM2-135M-Instruct"  # what /v1/models lists for the bundled model
BUNDLED_NAMES = {BUNDLED_MODEL, BUNDLED_MODEL_NAME, BUNDLED_MODEL_NAME.lower()}
JOB_PREFIX = "ftjob-"
_HUB_RE = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")
_CKPT_RE = re.compile(r"^ckpt-step-(\d{1,9})$")


def unknown_model(name: str) -> ApiError:
    return ApiError(404, f"The model '{name[:200]}' does not exist or you do not have access to it. Models this "
                         f"server fine-tunes: {BUNDLED_MODEL.removeprefix('bundled:')} (bundled), a model folder under "
                         "the data root, a hub model in this host's hub cache.", "invalid_request_error", "model",
                    "model_not_found")


def base_model(name: object) -> str:
    """The studio's model_name for a base model the request names; ApiError (param ``model``) otherwise."""
    if not isinstance(name, str) or not name.strip():
        raise invalid("model is required: the base model to fine-tune", "model")
    name = name.strip()
    if name in BUNDLED_NAMES:
        return BUNDLED_MODEL
    if name.startswith("ft:"):  # a fine-tuned model the caller did not resolve (jobs.start_point does)
        raise unknown_model(name)
    if name.startswith(("/", "~", ".")):
        try:
            folder = paths.resolve_inside(name, paths.allowed_data_roots())
        except (paths.UnsafePathError, paths.BadPathError):
            raise unknown_model(name) from None
        if (folder / "config.json").is_file():
            return str(folder)
        raise unknown_model(name)
    if _HUB_RE.match(name) and isinstance(try_to_load_from_cache(name, "config.json"), str):
        return name
    raise unknown_model(name)


def short_name(model_name: str) -> str:
    """The base model as it appears inside a fine-tuned model's name."""
    tail = model_name.removeprefix("bundled:").rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"[^a-z0-9._-]+", "-", tail.lower()).strip("-") or "model"


def fine_tuned_name(model_name: str, suffix: str, job_id: str, step: int | None = None) -> str:
    name = f"ft:{short_name(model_name)}:{suffix}:{job_id}"
    return name if step is None else f"{name}:ckpt-step-{step}"


def parse_fine_tuned(name: str) -> tuple[str, int | None] | None:
    """(job id, checkpoint step or None) of a fine-tuned model's name; None when it is not one."""
    parts = name.split(":")
    if len(parts) < 4 or parts[0] != "ft":
        return None
    step = None
    match = _CKPT_RE.match(parts[-1])
    if match:
        step, parts = int(match.group(1)), parts[:-1]
    return (parts[-1], step) if parts[-1].startswith(JOB_PREFIX) else None


def base_source(name: str) -> ModelSource | None:
    """A base model to chat with, None when ``name`` is not one this server has."""
    try:
        return ModelSource(model=base_model(name))
    except ApiError:
        return None
