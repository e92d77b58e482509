"""Model servers for the Playground and teammates: one serve job per set of models, found again by the models it
serves, its key and endpoint read from its folder.

``self`` is the Orchestrator (trainer_core/jobs/orchestrator.py), which composes this class."""
from __future__ import annotations

import json
import secrets as pysecrets

from trainer_core.auth import access
from trainer_core.specs import model_source
from trainer_core.protocol import paths, sandbox
from trainer_core.protocol.status import JobKind, RunStatus
from trainer_core.serving import endpoint as endpoint_file
from trainer_core.serving import spec as serve_spec


class Servers:
    # ================================================================== serving (serve jobs)
    def start_server(self, sources: list[model_source.ModelSource], actor: access.Actor | None = None,
                     purpose: str = "playground", host: str = "127.0.0.1", port: int = 0,
                     idle_timeout_s: int = serve_spec.DEFAULT_IDLE_S, engine: str = "auto",
                     name: str = "", tied: bool | None = None, **limits) -> tuple[str, str]:
        """Start (or queue) a serve job for ``sources``; returns (job id, API key). The key is generated
        here and only its sha256 is stored; a playground server's key stays in this orchestrator's memory
        (``server_key``), an endpoint's is shown once by the caller. ``tied`` (default: a playground's) ends
        the job when this process exits, queued or serving: nobody else has its key. ``limits``: the
        ServeSpec fields max_tokens_cap, request_timeout_s, tls_certfile, tls_keyfile, launcher ("ray": on the
        server's cluster). ConfigError lists every problem."""
        key = pysecrets.token_urlsafe(32)
        labels = ", ".join(s.key.removeprefix("run:").removeprefix("base:") for s in sources)
        tied = purpose == "playground" if tied is None else tied
        spec = serve_spec.ServeSpec(
            name=name or f"{'Playground' if purpose == 'playground' else 'Endpoint'} · {labels}"[:80],
            sources=list(sources), host=host, port=port, api_key_hash=serve_spec.hash_key(key),
            idle_timeout_s=idle_timeout_s, engine=engine, purpose=purpose,
            consumer=serve_spec.consumer_token() if tied else "", **limits)
        job_id = self.submit(spec, actor)
        if purpose == "playground":
            with self._lock:
                self._server_keys[job_id] = key
        return job_id, key

    def server_key(self, job_id: str) -> str | None:
        """The API key of a playground server this orchestrator started (None otherwise, or once it ended)."""
        with self._lock:
            key = self._server_keys.get(job_id)
        run = self.store.get_run(job_id) if key else None
        if run is None or run.status.is_terminal():
            with self._lock:
                self._server_keys.pop(job_id, None)
            return None
        return key

    def endpoint(self, job_id: str) -> endpoint_file.Endpoint | None:
        """Where a serve job listens and what it serves, while it runs (None before it is ready and after)."""
        run = self.store.get_run(job_id)
        if run is None or run.kind is not JobKind.SERVE or run.status not in (RunStatus.STARTING, RunStatus.RUNNING):
            return None
        try:
            found = endpoint_file.read(paths.run_dir(job_id))
        except paths.UnsafePathError:
            return None
        if found is None:
            return None
        # This host's worker wrote it (its pid), or, for a job on the Ray cluster (no pid here), one on a node did.
        # A sandboxed worker reports its pid in its own PID namespace: any pid of the job's process tree counts.
        written = found.pid in sandbox.job_pids(run.pid) if run.pid is not None else bool(found.node)
        return found if written and self._handle_of(run).state().alive else None

    def _handle_of(self, run):
        """The handle this orchestrator follows the job with (a Ray job's answers are cached a second), else a
        fresh one from the launcher."""
        with self._lock:
            tracked = self._tracked.get(run.id)
        return tracked.handle if tracked is not None else self.launcher.adopt(run)

    def find_server(self, sources: list[model_source.ModelSource], actor: access.Actor | None = None) -> str | None:
        """A queued or active playground server of ``actor`` serving exactly ``sources``, whose key this
        orchestrator holds (to reuse rather than load the same models twice); None when there is none."""
        wanted = sorted(s.key for s in sources)
        for run in self.store.active_runs() + self.store.queued_runs():
            if run.kind is not JobKind.SERVE or (actor is not None and run.owner != actor.name):
                continue
            if run.status is RunStatus.STOPPING or self.server_key(run.id) is None:
                continue
            spec = json.loads(self.store.get_run(run.id).config_json or "{}")
            if spec.get("purpose") == "playground" and sorted(
                    model_source.ModelSource.from_dict(s).key for s in spec.get("sources", [])) == wanted:
                return run.id
        return None
