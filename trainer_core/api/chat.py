"""Which model a chat request names: a fine-tuned model's name (or a checkpoint's) -> the studio's model source, and
who its server is started as (the fine-tuned model's owner; the caller for a base model), and its streamed answer
with the asked name in each chunk. The server itself: servers.py."""
from __future__ import annotations

import json
from typing import Callable

from trainer_core.api import jobs, models
from trainer_core.api.errors import ApiError, invalid
from trainer_core.auth import access
from trainer_core.specs.model_source import ModelSource
from trainer_core.jobs.orchestrator import Orchestrator
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
    run_id = jobs.run_with_checkpoint(chain, step)
    if run_id is None:
        raise models.unknown_model(name)
    return ModelSource(run_id=run_id, checkpoint=step), store_actor(record.owner)


class StreamRenamer:
    """A streamed chat answer (server-sent events, ``data: {chunk}`` lines) with each chunk's ``model`` set to the
    name the client asked for, not the serve job's name for it. Bytes go in as they arrive (a line may be split
    across reads); whole lines come out, a line that is no JSON chunk unchanged."""

    def __init__(self, name: str):
        self.name = name
        self.pending = b""

    def feed(self, data: bytes) -> bytes:
        lines = (self.pending + data).split(b"\n")
        self.pending = lines.pop()
        return b"".join(self._renamed(line) + b"\n" for line in lines)

    def close(self) -> bytes:
        rest, self.pending = self.pending, b""
        return self._renamed(rest) if rest else b""

    def _renamed(self, line: bytes) -> bytes:
        if not line.startswith(b"data:"):
            return line
        try:
            chunk = json.loads(line[5:])
        except ValueError:  # [DONE], or not ours to read
            return line
        if not isinstance(chunk, dict) or "model" not in chunk:
            return line
        chunk["model"] = self.name
        return b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + (b"\r" if line.endswith(b"\r") else b"")
