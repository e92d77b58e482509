"""The serve job behind ``/v1/chat/completions``: a fine-tuned model's name -> a model source -> a running server.

Design: the API starts (or reuses) one of the studio's ordinary serve jobs for the models asked for and forwards
each chat request to it with that job's key; it never loads a model itself. A serve job is a run like any other
(History, the queue, the device it holds, the sandbox), the engine is the studio's own (transformers serve, vLLM
on a GPU host), and what a job serves is what the Playground would. Loading adapters on demand inside one engine
would save the load of a second server, but needs an engine that swaps adapters (vLLM's LoRA support, not
``transformers serve``) and a second way of serving; one serve job per model set needs neither.

The job is started as the fine-tuned model's owner (they started the training it serves) or, for a base model, as
the caller; it is tied to the API process (it ends when the API server ends) and idles out after
``FINETUNE_STUDIO_API_SERVE_IDLE_S`` seconds (default 600) without requests, freeing its device for the queue.
Its key lives in the orchestrator's memory only (a playground server's key).
"""
from __future__ import annotations

import os
import threading
import time

from trainer_core.api import jobs, models
from trainer_core.api.errors import ApiError, invalid
from trainer_core.auth import access
from trainer_core.config import ConfigError
from trainer_core.jobs.jobspec import ModelSource
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.jobs.refusals import RunRefused
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus
from trainer_core.serving.endpoint import Endpoint

IDLE_ENV = "FINETUNE_STUDIO_API_SERVE_IDLE_S"
DEFAULT_IDLE_S = 600
READY_TIMEOUT_ENV = "FINETUNE_STUDIO_API_SERVE_WAIT_S"
DEFAULT_READY_TIMEOUT_S = 300  # a chat request waits this long for its model's server, then gets a 503
_start_lock = threading.Lock()  # two first requests for one model start one server


def source_of(orch: Orchestrator, name: object, store_actor) -> tuple[ModelSource, access.Actor]:
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


def endpoint_for(orch: Orchestrator, source: ModelSource, actor: access.Actor) -> tuple[Endpoint, str]:
    """A ready server of ``source`` and its key: the one already serving it, else a new serve job (waited for)."""
    with _start_lock:
        job_id = orch.find_server([source], actor)
        if job_id is None:
            try:
                job_id, _ = orch.start_server([source], actor=actor, purpose="playground", tied=True,
                                              idle_timeout_s=_env_int(IDLE_ENV, DEFAULT_IDLE_S),
                                              name=f"API · {source.key}"[:80])
            except ConfigError as exc:
                raise ApiError(400, "; ".join(f"{e.field}: {e.message}" for e in exc.errors), "invalid_request_error",
                               "model", "model_not_servable") from None
            except RunRefused as exc:
                raise ApiError(403, str(exc), "permission_error", "model", "permission_denied") from None
    deadline = time.monotonic() + _env_int(READY_TIMEOUT_ENV, DEFAULT_READY_TIMEOUT_S)
    while True:
        endpoint = orch.endpoint(job_id)
        key = orch.server_key(job_id)
        if endpoint is not None and key is not None:
            return endpoint, key
        run = orch.get_run(job_id)
        if run is None or run.status.is_terminal():
            reason = (run.error if run is not None else "") or "it ended before it was ready"
            raise ApiError(500, f"the server for this model did not start: {reason}", "server_error", "model",
                           "model_server_failed")
        if time.monotonic() > deadline:
            where = "is waiting in the queue behind other jobs" if run.status is RunStatus.QUEUED else "is still loading"
            raise ApiError(503, f"the model's server (job {job_id}) {where}; try again shortly", "server_error",
                           "model", "model_loading")
        time.sleep(0.5)


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default
