"""Which model a chat request names: a fine-tuned model's name (or a checkpoint's) -> the studio's model source, and
who its server is started as (the fine-tuned model's owner; the caller for a base model). The server itself:
servers.py."""
from __future__ import annotations

from typing import Callable

from trainer_core.api import jobs, models
from trainer_core.api.errors import ApiError, invalid
from trainer_core.auth import access
from trainer_core.specs.model_source import ModelSource
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus


def source_of(orch: Orchestrator, name: object, store_actor: Callable[[str | None], access.Actor]
              ) -> tuple[ModelSource, access.Actor]:
    """The model source a chat request's ``model`` names, and who its server is started as."""
    if not isinstance(name, str) or not name:
        raise invalid("model is required", "model")
    parsed = models.parse_fine_tuned(name)
    if parsed is None:
        source = models.base_source(name)
        if source is None:
            raise models.unknown_model(name)
        return source, store_actor(None)
    job_id, step = parsed
    try:
        record = jobs.get(job_id)
    except ApiError:
        raise models.unknown_model(name) from None
    if jobs.fine_tuned_model(record, step) != name:
        raise models.unknown_model(name)
    chain = jobs.runs_of(orch, record)
    if step is None:
        if not chain or chain[-1].status is not RunStatus.COMPLETED:
            raise ApiError(404, f"The model '{name}' is not ready: its job {record.id} has not succeeded",
                           "invalid_request_error", "model", "model_not_found")
        return ModelSource(run_id=chain[-1].id), store_actor(record.owner)
    for run in reversed(chain):
        folder = paths.run_dir(run.id) / "checkpoints" / f"checkpoint-{step}"
        if folder.is_dir():
            return ModelSource(run_id=run.id, checkpoint=step), store_actor(record.owner)
    raise models.unknown_model(name)
