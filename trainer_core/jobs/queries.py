"""What the pages and the CLI read through the orchestrator: runs and their live state, metrics (a run's own
or its lineage's), logs, samples, eval results, artifacts and the jobs of a run; ``wait`` for a job to end.

``self`` is the Orchestrator (trainer_core/jobs/orchestrator.py), which composes this class."""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Iterable

import pandas as pd

from db.entities import ArtifactRecord, EvalResultRecord, EventRecord, RunRecord, SampleRecord
from trainer_core.jobs import evals, pump, queue
from trainer_core.jobs.live import LiveSnapshot
from trainer_core.jobs.remote_view import lineage_frame
from trainer_core.jobs.resources import ResourceSample
from trainer_core.protocol import files, paths
from trainer_core.protocol.status import JobKind


HISTORY_PAGE = 50


class Queries:
    def resources(self, run_id: str) -> ResourceSample | None:
        """CPU/RAM of the run's worker process tree and the host's GPUs; None when it is not running."""
        run = self.store.get_run(run_id)
        if run is None or run.status.is_terminal():
            return None
        worker = self.launcher.adopt(run)
        if worker.pid is None or not worker.state().alive:
            return None
        return self._sampler.sample(worker.pid, queue.gpu_indices(run.devices))

    def alert_counts(self, run_ids: list[str]) -> dict[str, int]:
        return self.store.event_counts(run_ids, "alert")

    def queue(self) -> list[RunRecord]:
        return self.store.queued_runs()

    def active_run_id(self, kind: JobKind | None = JobKind.TRAIN) -> str | None:
        """A job with a worker now (a training run unless ``kind`` says otherwise; None: any kind)."""
        with self._lock:
            for run_id, tracked in self._tracked.items():
                if tracked.terminal is None and kind in (None, tracked.kind):
                    return run_id
        active = [r for r in self.store.active_runs() if kind in (None, r.kind)]
        return active[0].id if active else None

    def snapshot(self, run_id: str) -> LiveSnapshot | None:
        with self._lock:
            tracked = self._tracked.get(run_id)
            live = tracked.live if tracked else self._finished.get(run_id)
        if live is not None:
            return live.snapshot()
        return self._remote.snapshot(run_id)

    def list_runs(self, limit: int = HISTORY_PAGE, offset: int = 0, search: str = "",
                  owners: list[str] | None = None, kinds: list[JobKind] | None = None) -> list[RunRecord]:
        """A page of jobs, newest first (without their config and log tail: use get_run for those)."""
        return self.store.list_runs(limit=limit, offset=offset, search=search, owners=owners, kinds=kinds)

    def count_runs(self, search: str = "", owners: list[str] | None = None, kinds: list[JobKind] | None = None) -> int:
        return self.store.count_runs(search, owners, kinds)

    def run_owners(self) -> list[str]:
        return self.store.run_owners()

    def get_run(self, run_id: str) -> RunRecord | None:
        return self.store.get_run(run_id)

    def get_runs(self, run_ids: list[str]) -> list[RunRecord]:
        """The runs with these ids that exist, in the order asked for (any run, however old)."""
        return self.store.get_runs(run_ids)

    def metrics(self, run_id: str, lineage: bool = False, columns: Iterable[str] | None = None,
                keys: Iterable[str] | None = None) -> pd.DataFrame:
        """A run's metrics; with ``lineage``, preceded by those of the runs it resumed from; ``columns``: only
        ``step`` and these wide fields, ``keys``: these open metric keys (Store.metrics_frame)."""
        if not lineage:
            return self.store.metrics_frame(run_id, columns=columns, keys=keys)
        earlier, own = self.metrics_parts(run_id)
        frame = pd.concat([earlier, own], ignore_index=True) if len(earlier) else own
        if columns is None and keys is None:
            return frame
        wanted = {"step", *(columns if columns is not None else frame.columns), *(keys or ())}
        return frame[[c for c in frame.columns if c in wanted]]

    def metrics_parts(self, run_id: str, columns: Iterable[str] | None = None, keys: Iterable[str] | None = None
                      ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(metrics of the runs it resumed from, its own metrics): one read each; ``columns``: only ``step``
        and these wide fields, ``keys``: these open metric keys."""
        own = self.store.metrics_frame(run_id, columns=columns, keys=keys)
        run = self.store.get_run(run_id)
        if run is None or not run.parent_run_id:
            return own.iloc[:0], own
        earlier = lineage_frame(self.store, run)
        return (earlier if columns is None else earlier[[c for c in own.columns if c in earlier]]), own

    def metric_keys(self, run_id: str) -> list[str]:
        """The open metric keys a run logged (besides the wide fields), sorted."""
        return self.store.metric_keys(run_id)

    def events(self, run_id: str) -> list[EventRecord]:
        return self.store.get_events(run_id)

    def sparklines(self, runs: list[RunRecord]) -> dict[str, list[float]]:
        """History's loss sparklines, stored with the runs (computed once for runs recorded before)."""
        return self.store.sparklines(runs)

    def run_config(self, run_id: str) -> dict[str, Any]:
        run = self.store.get_run(run_id)
        if run is None:
            return {}
        return json.loads(run.config_json or "{}")

    def log_tail(self, run_id: str, lines: int = pump.LOG_TAIL_LINES) -> str:
        try:
            return pump.tail(paths.run_dir(run_id) / "worker.log", lines)
        except paths.UnsafePathError:
            return ""

    def log_text(self, run_id: str, max_bytes: int = 8 << 20) -> str:
        """The worker log (its last ``max_bytes`` when longer), for download and filtering."""
        try:
            return files.read_end(paths.run_dir(run_id) / "worker.log", max_bytes)
        except paths.UnsafePathError:
            return ""

    def wait(self, run_id: str, timeout: float | None = None, on_tick: Callable[[LiveSnapshot], None] | None = None,
             interval: float = 0.5) -> LiveSnapshot:
        """Block until the run is terminal in the database (used by the CLI and tests)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if on_tick:  # a snapshot of a run pumped elsewhere is rebuilt from the database: only when shown
                snap = self.snapshot(run_id)
                if snap:
                    on_tick(snap)
            run = self.store.get_run(run_id)
            if run is not None and run.status.is_terminal() and not self._is_tracked(run_id):
                return self.snapshot(run_id)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} still {run.status if run else 'missing'} after {timeout}s")
            time.sleep(interval)

    # ================================================================== samples during training
    def samples(self, run_id: str, max_steps: int = 50) -> list[SampleRecord]:
        """A run's sample answers, newest sampling step first (the store holds what the pump has read)."""
        return self.store.samples(run_id, max_steps)

    def sample_prompts(self, run_ids: list[str]) -> list[str]:
        return self.store.sample_prompts(run_ids)

    def prompt_samples(self, run_ids: list[str], prompt: str) -> list[SampleRecord]:
        return self.store.prompt_samples(run_ids, prompt)

    def eval_result(self, job_id: str) -> EvalResultRecord | None:
        return self.store.eval_result(job_id)

    def eval_results(self, run_id: str) -> list[EvalResultRecord]:
        """Every eval of a run's models, newest first."""
        return self.store.eval_results(run_id)

    def eval_baseline(self, result: EvalResultRecord) -> EvalResultRecord | None:
        """The base model's eval on the same data and settings and, once completed, the same rows (None when
        there is none, or it is the same job)."""
        return evals.baseline_of(self.store, result)

    def eval_samples(self, job_id: str) -> pd.DataFrame:
        return self.store.eval_samples(job_id)

    def eval_predictions(self, job_id: str) -> list[dict]:
        """What a running eval has written to its predictions file so far."""
        return evals.read_predictions(job_id)

    def latest_eval_metrics(self, run_ids: list[str]) -> dict[str, dict]:
        return self.store.latest_eval_metrics(run_ids)

    # ================================================================== export artifacts
    def artifacts(self, source_run_id: str | None = None, job_id: str | None = None) -> list[ArtifactRecord]:
        """Published export artifacts of a run's exports (or of one export job), newest first."""
        return self.store.artifacts(job_id=job_id, source_run_id=source_run_id)

    def endpoint_jobs(self, run_id: str) -> list[RunRecord]:
        """The endpoint servers started on a run's model, newest first (playground servers are the Playground's)."""
        jobs = [r for r in reversed(self.store.children(run_id)) if r.kind is JobKind.SERVE]
        return [r for r in jobs if self.run_config(r.id).get("purpose") == "endpoint"]

    def export_jobs(self, run_id: str) -> list[RunRecord]:
        """The export jobs started on a run's model, newest first."""
        return [r for r in reversed(self.store.children(run_id)) if r.kind is JobKind.EXPORT]
