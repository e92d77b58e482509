"""In-memory live state of a run, fed by the pump thread and read by pages as immutable snapshots."""
from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from trainer_core.protocol import events as ev
from trainer_core.protocol.metrics import METRIC_COLUMNS, WIDE_NAMES, merge_metric
from trainer_core.protocol.status import RunStatus

@dataclass(frozen=True)
class LiveSnapshot:
    run_id: str
    name: str
    status: RunStatus
    phase: str = ""
    engine: str = ""
    model: str = ""
    dataset: str = ""
    method: str = ""
    step: int = 0
    total_steps: int = 0
    epoch: float | None = None
    loss: float | None = None
    eval_loss: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    tokens_seen: int | None = None
    tokens_per_s: float | None = None
    memory_mb: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    eta_s: float | None = None
    error: str = ""
    log_tail: str = ""
    output_dir: str = ""
    warnings: tuple[str, ...] = ()
    alerts: tuple = ()  # trainer_core.jobs.alerts.Alert, oldest first
    # The wide columns, then one column per open metric key (``metric_keys``, in the order first seen).
    metrics: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=METRIC_COLUMNS))
    metric_keys: tuple[str, ...] = ()

    @property
    def progress(self) -> float:
        return min(1.0, self.step / self.total_steps) if self.total_steps else 0.0

    @property
    def elapsed_s(self) -> float:
        if not self.started_at:
            return 0.0
        return (self.finished_at or time.time()) - self.started_at


class LiveRun:
    """Mutable state of one run, guarded by a lock; ``snapshot()`` copies it out for the UI."""

    def __init__(self, run_id: str, name: str, status: RunStatus, **info: Any):
        self._lock = threading.Lock()
        self._state: dict[str, Any] = {"run_id": run_id, "name": name, "status": status, **info}
        self._rows: list[dict[str, Any]] = []
        self._index: dict[int, int] = {}
        self._warnings: list[str] = []
        self._alerts: list[Any] = []
        # The metrics frame is rebuilt only from the first row that changed since the last snapshot:
        # a 100k-step run otherwise pays ~200 ms per refresh copying rows that never change.
        self._frame = pd.DataFrame(columns=METRIC_COLUMNS)
        self._dirty_from = 0
        self._keys: dict[str, None] = {}  # open metric keys, in the order first seen
        self._build_lock = threading.Lock()

    def update(self, **values: Any) -> None:
        with self._lock:
            self._state.update(values)

    @property
    def status(self) -> RunStatus:
        with self._lock:
            return self._state["status"]

    @property
    def step(self) -> int:
        with self._lock:
            return self._state.get("step") or 0

    @property
    def phase(self) -> str:
        with self._lock:
            return self._state.get("phase") or ""

    def add_warning(self, message: str) -> None:
        with self._lock:
            self._warnings.append(message)

    def add_alert(self, alert: Any) -> None:
        with self._lock:
            self._alerts.append(alert)

    def add_metric(self, row: dict[str, Any]) -> None:
        """Merge a metric row by step (train and eval rows of one step become one)."""
        with self._lock:
            step = int(row["step"])
            if not row.keys() <= WIDE_NAMES:  # open metrics
                self._keys.update(dict.fromkeys(k for k in row if k not in WIDE_NAMES))
            if step in self._index:
                position = self._index[step]
                merge_metric(self._rows[position], row)
                self._dirty_from = min(self._dirty_from, position)
            else:
                self._index[step] = len(self._rows)
                self._rows.append(dict(row))

    def snapshot(self) -> LiveSnapshot:
        # Snapshots take turns (each extends the cached frame), but the pump's add_metric only waits while
        # rows are copied: the frame is built outside the state lock.
        with self._build_lock:
            with self._lock:
                state = dict(self._state)
                warnings = tuple(self._warnings)
                alerts = tuple(self._alerts)
                start = self._dirty_from
                changed = [dict(r) for r in self._rows[start:]]  # copies: add_metric mutates rows in place
                self._dirty_from = len(self._rows)  # a merge into an older row while we build lowers it again
                keys = tuple(self._keys)
            if changed:
                fresh = pd.DataFrame(changed, columns=[*METRIC_COLUMNS, *keys])
                self._frame = pd.concat([self._frame.iloc[:start], fresh], ignore_index=True) if start else fresh
            frame = self._frame
        names = {f.name for f in dataclasses.fields(LiveSnapshot)}
        # Pages only read the frame; a shallow copy keeps one page from reshaping another's view.
        return LiveSnapshot(**{k: v for k, v in state.items() if k in names}, warnings=warnings, alerts=alerts,
                            metrics=frame.copy(deep=False), metric_keys=keys)


_ROW_FIELDS = {cls: [k for k in METRIC_COLUMNS if k in {f.name for f in dataclasses.fields(cls)}]
               for cls in (ev.ProgressEvent, ev.EvalEvent)}


def metric_row(event: ev.ProgressEvent | ev.EvalEvent) -> dict[str, Any]:
    """The metric row an event contributes: its wide fields, then its open metrics (NaN values are None,
    named in ``nonfinite``: ``loss``, ``metrics.rewards/format/mean``; None open values are left out)."""
    values = event.__dict__  # the dataclass fields (asdict deep-copies: slow)
    row = {k: values[k] for k in _ROW_FIELDS[type(event)]}
    row["wall_time"] = event.ts
    row["nonfinite"] = ",".join(sorted(event.nonfinite))
    if event.metrics:
        row.update((k, v) for k, v in event.metrics.items() if v is not None and k not in WIDE_NAMES)
    return row
