"""``/v1/models``: OpenAI's model objects (``{"id", "object": "model", "created", "owned_by"}``) for the models this
server fine-tunes from and answers chats with.

Listed: the bundled model, the hub models in this host's hub cache (both a job's ``model`` may name), and each
succeeded job's ``fine_tuned_model`` (owned by who trained it). A model folder under the allowed roots is a valid
``model`` too, but folders are not listed (the roots may hold any number); ``retrieve`` answers for one, and for
a checkpoint's name (``...:ckpt-step-N``) while its folder is there. Anything else is a 404 naming ``model``.
"""
from __future__ import annotations

from huggingface_hub import scan_cache_dir, try_to_load_from_cache
from huggingface_hub.errors import CacheNotFound

from trainer_core.api import jobs, models
from trainer_core.api.errors import ApiError
from trainer_core.config import BUNDLED_MODEL
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol.status import RunStatus

STUDIO = "finetune-studio"


def model_object(model_id: str, created: int, owned_by: str) -> dict:
    return {"id": model_id, "object": "model", "created": created, "owned_by": owned_by}


def listing(orch: Orchestrator) -> dict:
    data = [model_object(models.BUNDLED_MODEL_NAME, 0, STUDIO), *hub_models()]
    for record in jobs.all_records():
        if jobs.status_of(orch, record) == "succeeded":
            data.append(model_object(jobs.fine_tuned_model(record), record.created_at, record.owner))
    return {"object": "list", "data": data}


def hub_models() -> list[dict]:
    """The model repositories of this host's hub cache that hold a model (a config.json)."""
    try:
        repos = scan_cache_dir().repos
    except (CacheNotFound, OSError):
        return []
    found = [repo for repo in repos if repo.repo_type == "model"
             and isinstance(try_to_load_from_cache(repo.repo_id, "config.json"), str)]
    return [model_object(repo.repo_id, int(repo.last_modified), repo.repo_id.split("/")[0] if "/" in repo.repo_id
                         else "huggingface") for repo in sorted(found, key=lambda r: r.repo_id)]


def retrieve(orch: Orchestrator, name: str) -> dict:
    """The model object of ``name``: a base model a job may start from, or a fine-tuned model (or checkpoint)."""
    parsed = models.parse_fine_tuned(name)
    if parsed is None:
        model_name = models.base_model(name)  # ApiError naming model when it is not one
        owner = STUDIO if model_name == BUNDLED_MODEL else "local" if model_name.startswith("/") else \
            model_name.split("/")[0]
        return model_object(name, 0, owner)
    job_id, step = parsed
    try:
        record = jobs.get(job_id)
    except ApiError:
        raise models.unknown_model(name) from None
    chain = jobs.runs_of(orch, record)
    if jobs.fine_tuned_model(record, step) != name or not chain:
        raise models.unknown_model(name)
    if step is None and chain[-1].status is not RunStatus.COMPLETED:
        raise models.unknown_model(name)
    if step is not None and jobs.run_with_checkpoint(chain, step) is None:
        raise models.unknown_model(name)
    return model_object(name, record.created_at, record.owner)
