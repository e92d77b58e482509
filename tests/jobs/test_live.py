"""Live run state: merging metric rows and handing out immutable snapshots."""
from __future__ import annotations

import dataclasses
import math
import types

import pandas as pd
import pytest

from trainer_core.protocol import events as ev
from trainer_core.jobs import live
from trainer_core.jobs.live import LiveRun, LiveSnapshot, metric_row
from trainer_core.protocol.metrics import METRIC_COLUMNS
from trainer_core.protocol.status import RunStatus


def progress(step: int, **kw) -> ev.ProgressEvent:
    return ev.ProgressEvent(step=step, total_steps=10, ts=100.0 + step, **kw)


def test_metric_row_from_progress_event():
    row = metric_row(progress(3, epoch=0.3, loss=1.5, learning_rate=1e-4, grad_norm=0.7, tokens_seen=300,
                              tokens_per_s=50.0, memory_mb=900.0, elapsed_s=6.0, eta_s=14.0))
    assert row == {"step": 3, "epoch": 0.3, "loss": 1.5, "learning_rate": 1e-4, "grad_norm": 0.7,
                   "tokens_seen": 300, "tokens_per_s": 50.0, "memory_mb": 900.0, "elapsed_s": 6.0,
                   "wall_time": 103.0, "nonfinite": ""}
    assert set(row) <= set(METRIC_COLUMNS)


def test_metric_row_from_eval_event():
    assert metric_row(ev.EvalEvent(step=4, eval_loss=2.5, ts=7.0)) == {
        "step": 4, "eval_loss": 2.5, "wall_time": 7.0, "nonfinite": ""}


def test_metric_row_keeps_nonfinite_names_from_the_event_log():
    line = ev.encode(progress(2, loss=math.nan, grad_norm=math.inf, learning_rate=1e-4))
    row = metric_row(ev.decode(line))
    assert row["loss"] is None and row["grad_norm"] is None
    assert row["learning_rate"] == 1e-4
    assert row["nonfinite"] == "grad_norm,loss"


def test_new_run_snapshot_is_empty():
    snap = LiveRun("r1", "first", RunStatus.QUEUED, model="m", method="LoRA", pid=77).snapshot()
    assert (snap.run_id, snap.name, snap.status, snap.model, snap.method) == ("r1", "first", RunStatus.QUEUED,
                                                                             "m", "LoRA")
    assert (snap.step, snap.total_steps, snap.warnings) == (0, 0, ())
    assert list(snap.metrics.columns) == METRIC_COLUMNS
    assert snap.metrics.empty
    assert snap.progress == 0.0
    assert snap.elapsed_s == 0.0


def test_train_and_eval_rows_of_one_step_merge():
    run = LiveRun("r1", "x", RunStatus.RUNNING)
    run.add_metric(metric_row(progress(1, loss=2.0)))
    run.add_metric(metric_row(progress(2, loss=1.5, learning_rate=1e-4)))
    run.add_metric(metric_row(ev.EvalEvent(step=2, eval_loss=1.8, ts=200.0)))
    frame = run.snapshot().metrics
    assert frame["step"].tolist() == [1, 2]
    second = frame.iloc[1]
    assert (second["loss"], second["eval_loss"], second["learning_rate"], second["wall_time"]) == (
        1.5, 1.8, 1e-4, 200.0)
    assert pd.isna(frame.iloc[0]["eval_loss"])


def test_merge_does_not_erase_with_empty_values():
    run = LiveRun("r1", "x", RunStatus.RUNNING)
    run.add_metric({"step": 5, "loss": None, "nonfinite": "loss"})
    run.add_metric({"step": 5, "loss": None, "eval_loss": 3.0, "nonfinite": ""})
    row = run.snapshot().metrics.iloc[0]
    assert row["nonfinite"] == "loss"
    assert row["eval_loss"] == 3.0
    assert pd.isna(row["loss"])


def test_add_metric_does_not_keep_a_reference_to_the_callers_row():
    run = LiveRun("r1", "x", RunStatus.RUNNING)
    row = {"step": 1, "loss": 1.0}
    run.add_metric(row)
    row["loss"] = 99.0
    assert run.snapshot().metrics["loss"].tolist() == [1.0]


def test_snapshot_is_a_copy():
    run = LiveRun("r1", "x", RunStatus.RUNNING, step=1, total_steps=10)
    run.add_metric({"step": 1, "loss": 2.0})
    run.add_warning("first")
    snap = run.snapshot()

    run.update(step=2, status=RunStatus.STOPPING, phase="saving")
    run.add_metric({"step": 1, "eval_loss": 2.2})
    run.add_metric({"step": 2, "loss": 1.0})
    run.add_warning("second")

    assert (snap.step, snap.status, snap.phase, snap.warnings) == (1, RunStatus.RUNNING, "", ("first",))
    assert snap.metrics["step"].tolist() == [1]
    assert pd.isna(snap.metrics.iloc[0]["eval_loss"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.step = 5  # type: ignore[misc]

    later = run.snapshot()
    assert (later.step, later.status, later.phase, later.warnings) == (2, RunStatus.STOPPING, "saving",
                                                                       ("first", "second"))
    assert later.metrics["step"].tolist() == [1, 2]
    assert later.metrics.iloc[0]["eval_loss"] == 2.2
    assert run.status is RunStatus.STOPPING


def test_snapshot_rows_are_copied_under_the_lock(monkeypatch):
    """The frame is built outside the lock, so it must not read rows the pump thread can still merge into."""
    run = LiveRun("r1", "x", RunStatus.RUNNING)
    run.add_metric({"step": 1, "loss": 2.0})
    real_frame = pd.DataFrame

    def frame_while_pump_merges(rows=None, *args, **kwargs):
        run.add_metric({"step": 1, "eval_loss": 9.0})  # the pump thread runs between lock release and build
        return real_frame(rows, *args, **kwargs)

    monkeypatch.setattr(live, "pd", types.SimpleNamespace(DataFrame=frame_while_pump_merges))
    snap = run.snapshot()
    assert pd.isna(snap.metrics.iloc[0]["eval_loss"])


@pytest.mark.parametrize("step, total, expected", [(0, 0, 0.0), (5, 0, 0.0), (0, 10, 0.0), (3, 12, 0.25),
                                                   (10, 10, 1.0), (12, 10, 1.0)])
def test_progress(step, total, expected):
    assert LiveSnapshot(run_id="r", name="n", status=RunStatus.RUNNING, step=step, total_steps=total).progress == expected


def test_elapsed_uses_finish_time_or_now(monkeypatch):
    monkeypatch.setattr(live, "time", types.SimpleNamespace(time=lambda: 1050.0))
    base = dict(run_id="r", name="n", status=RunStatus.RUNNING)
    assert LiveSnapshot(**base).elapsed_s == 0.0
    assert LiveSnapshot(**base, started_at=1000.0).elapsed_s == 50.0
    assert LiveSnapshot(**base, started_at=1000.0, finished_at=1020.5).elapsed_s == 20.5


def test_snapshots_extend_the_frame_and_pick_up_merges_into_older_rows():
    live = LiveRun("r", "n", RunStatus.RUNNING)
    for step in range(1, 6):
        live.add_metric({"step": step, "loss": float(step), "nonfinite": ""})
    assert list(live.snapshot().metrics["step"]) == [1, 2, 3, 4, 5]
    live.add_metric({"step": 2, "eval_loss": 0.5, "nonfinite": ""})  # an eval row merged into an old step
    live.add_metric({"step": 6, "loss": 6.0, "nonfinite": ""})
    frame = live.snapshot().metrics
    assert list(frame["step"]) == [1, 2, 3, 4, 5, 6]
    assert frame.loc[frame["step"] == 2, "eval_loss"].tolist() == [0.5]
    assert frame.loc[frame["step"] == 2, "loss"].tolist() == [2.0]
    again = live.snapshot().metrics  # nothing changed: same content
    assert again.equals(frame)
