"""Live state of a run from the database: for runs pumped by another process (one started from the CLI,
or by another server) and for runs adopted after a restart.

A view is built once from the stored rows and then kept current incrementally: each refresh reads the
run row and only the metric rows from the last step it has seen (that row again, since an eval row of the
same step may have been merged into it since). The alert monitor sees each row once, so alerts are never
replayed; the rules are deterministic, so the result equals a full rebuild (tested).
"""
from __future__ import annotations

import threading

import pandas as pd

from db.entities import RunRecord
from db.store import Store
from trainer_core.data.bounded_cache import BoundedCache
from trainer_core.jobs.alerts import AlertMonitor, SampleAlerts, rows_from_frame
from trainer_core.jobs.live import LiveRun, LiveSnapshot
from trainer_core.protocol.status import RunStatus


class RemoteView:
    def __init__(self, run: RunRecord, store: Store):
        self.run_id = run.id
        self._store = store
        self._lock = threading.Lock()  # several sessions may refresh one view at once
        self.live = LiveRun(run.id, run.name, RunStatus(run.status))
        self.monitor = AlertMonitor()
        self.losses: dict[int, float] = {}  # this run's own train losses by step (its sparkline)
        self._last_step: int | None = None
        self.sample_alerts = SampleAlerts()  # degenerate sample answers: once per kind, however often seen
        self._last_sample_step: int | None = None
        self._complete = False  # the run was terminal before its rows were last read: nothing more comes
        seed_lineage(self.live, run, store)
        self.refresh(run)

    def refresh(self, run: RunRecord) -> None:
        """Bring the view up to ``run`` (a row just read) and the metric rows stored since the last refresh."""
        with self._lock:
            self.live.update(status=RunStatus(run.status), phase=run.phase, engine=run.engine, model=run.model,
                             dataset=run.dataset, method=run.method, step=run.steps_done,
                             total_steps=run.total_steps, epoch=run.epoch, loss=run.last_loss,
                             eval_loss=run.best_eval_loss, tokens_seen=run.tokens_seen, started_at=run.started_at,
                             finished_at=run.finished_at, error=run.error, log_tail=run.log_tail,
                             output_dir=run.output_dir)
            if self._complete:
                return
            self._complete = RunStatus(run.status).is_terminal()  # its rows were all stored before it ended
            rows = self._store.metric_rows(run.id, from_step=self._last_step)
            for row in rows:
                self.live.add_metric(row)
                if row["loss"] is not None:
                    self.losses[row["step"]] = row["loss"]
                for alert in self.monitor.observe(row):
                    self.live.add_alert(alert)
            if rows:
                self._last_step = rows[-1]["step"]
            self._observe_samples(run.id)

    def _observe_samples(self, run_id: str) -> None:
        """Sample answers stored since the last refresh (their last step again: it may have grown)."""
        for sample in self._store.samples_from(run_id, self._last_sample_step):
            for alert in self.sample_alerts.observe(sample.step, sample.index, sample.flags):
                self.live.add_alert(alert)
            self._last_sample_step = sample.step


class RemoteViews:
    """Views of the runs this process does not pump, the ``keep`` most recently shown: a view is built once
    (reading every row), then only new rows are read."""

    def __init__(self, store: Store, keep: int):
        self._store = store
        self._views: BoundedCache[str, RemoteView] = BoundedCache(keep)

    def snapshot(self, run_id: str) -> LiveSnapshot | None:
        run = self._store.get_run(run_id)
        if run is None:
            self._views.pop(run_id)
            return None
        view = self._views.get(run_id)
        if view is None:
            view = RemoteView(run, self._store)  # outside any lock: the first build reads every row
            self._views.put(run_id, view)
        else:
            view.refresh(run)
        return view.live.snapshot()

    def forget(self, run_id: str) -> None:
        """The run is pumped here now, or was deleted."""
        self._views.pop(run_id)


def seed_lineage(live: LiveRun, run: RunRecord, store: Store) -> None:
    """A resumed run's chart continues its parent's: show the parent's metrics up to the resume step."""
    if not run.parent_run_id or run.resumed_from_step is None:
        return
    for row in rows_from_frame(lineage_frame(store, run)):
        live.add_metric(row)


def lineage_frame(store: Store, run: RunRecord) -> pd.DataFrame:
    """Metrics of the runs this one resumed from, each cut at the step the next one continued from."""
    parts: list[pd.DataFrame] = []
    seen = {run.id}
    child = run
    while child.parent_run_id and child.parent_run_id not in seen and child.resumed_from_step is not None:
        parent = store.get_run(child.parent_run_id)
        if parent is None:
            break
        frame = store.metrics_frame(parent.id)
        parts.insert(0, frame[frame["step"] <= child.resumed_from_step])
        seen.add(parent.id)
        child = parent
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["step"])
