"""The serve job behind ``/v1/chat/completions``: a model source -> a running server of the studio, and its key.

Design: the API starts (or reuses) one of the studio's ordinary serve jobs for the models asked for and forwards
each chat request to it with that job's key; it never loads a model itself. A serve job is a run like any other
(History, the queue, the device it holds, the sandbox), the engine is the studio's own (transformers serve, vLLM
on a GPU host), and what a job serves is what the Playground would. Loading adapters on demand inside one engine
would save the load of a second server, but needs an engine that swaps adapters (vLLM's LoRA support, not
``transformers serve``) and a second way of serving; one serve job per model set needs neither.

The job is started as the fine-tuned model's owner (they started the training it serves) or, for a base model, as
the caller; it is tied to the API process (it ends when the API server ends) and idles out after
``FINETUNE_STUDIO_API_SERVE_IDLE_S`` seconds (default 600) without requests, freeing its device for the queue.
Its key lives in the orchestrator's memory only (a playground server's key). Training comes first: a job the API
creates or resumes that has to wait in the queue stops the chat servers this API started (``make_room``); the next
chat request starts its server again once the device is free.
"""
from __future__ import annotations

import os
import threading
import time

from trainer_core.api.errors import ApiError
from trainer_core.auth import access
from trainer_core.config import ConfigError
from trainer_core.specs.model_source import ModelSource
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.jobs.refusals import RunRefused
from trainer_core.protocol.status import RunStatus
from trainer_core.serving.endpoint import Endpoint

IDLE_ENV = "FINETUNE_STUDIO_API_SERVE_IDLE_S"
DEFAULT_IDLE_S = 600
READY_TIMEOUT_ENV = "FINETUNE_STUDIO_API_SERVE_WAIT_S"
DEFAULT_READY_TIMEOUT_S = 300  # a chat request waits this long for its model's server, then gets a 503
_start_lock = threading.Lock()  # two first requests for one model start one server
_started: set[str] = set()  # the serve jobs this process started


def endpoint_for(orch: Orchestrator, source: ModelSource, actor: access.Actor) -> tuple[Endpoint, str]:
    """A ready server of ``source`` and its key: the one already serving it, else a new serve job (waited for)."""
    with _start_lock:
        job_id = orch.find_server([source], actor)
        if job_id is None:
            try:
                job_id, _ = orch.start_server([source], actor=actor, purpose="playground", tied=True,
                                              idle_timeout_s=_env_int(IDLE_ENV, DEFAULT_IDLE_S),
                                              name=f"API · {source.key}"[:80])
                _started.add(job_id)
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


def make_room(orch: Orchestrator, run_id: str) -> None:
    """When the run ``run_id`` waits in the queue, stop the chat servers this API started: a fine-tuning job is
    not held up by an idle chat model (the Stop is written to each server's timeline)."""
    run = orch.get_run(run_id)
    if run is None or run.status is not RunStatus.QUEUED:
        return
    with _start_lock:
        for job_id in sorted(_started):
            server = orch.get_run(job_id)
            if server is None or server.status.is_terminal():
                _started.discard(job_id)
            else:
                orch.stop(job_id)
