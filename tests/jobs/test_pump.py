"""The pump's parts without a worker: the metric buffer, the job kind -> event kind -> handler table, and
how an event a job kind does not report is handled."""
from __future__ import annotations

import types

import pytest

from trainer_core.jobs import pump
from trainer_core.jobs.live import LiveRun
from trainer_core.jobs.pump import HANDLERS, LIFECYCLE, MetricBuffer, Tracker
from trainer_core.protocol import events as ev
from trainer_core.protocol.status import JobKind, RunStatus


@pytest.fixture
def clock(monkeypatch):
    """A controllable monotonic clock for MetricBuffer (the pump's other uses of time stay real)."""
    now = [1000.0]
    fake = types.SimpleNamespace(monotonic=lambda: now[0], time=lambda: now[0])
    monkeypatch.setattr(pump, "time", fake)
    return now


def test_buffer_flushes_by_count(clock):
    buf = MetricBuffer(max_rows=3, max_age_s=60.0)
    assert buf.due() is False
    buf.add({"step": 1, "loss": 1.0})
    buf.add({"step": 2, "loss": 0.9})
    assert buf.due() is False
    buf.add({"step": 2, "eval_loss": 1.5})  # same step merges, does not count twice
    assert buf.due() is False
    buf.add({"step": 3, "loss": 0.8})
    assert buf.due() is True
    assert buf.take() == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.9, "eval_loss": 1.5},
                          {"step": 3, "loss": 0.8}]
    assert buf.due() is False
    assert buf.take() == []


def test_buffer_flushes_by_age_of_the_oldest_row(clock):
    buf = MetricBuffer(max_rows=100, max_age_s=1.0)
    buf.add({"step": 1, "loss": 1.0})
    clock[0] += 0.5
    buf.add({"step": 2, "loss": 0.9})  # a newer row does not restart the clock
    assert buf.due() is False
    clock[0] += 0.5
    assert buf.due() is True
    assert [r["step"] for r in buf.take()] == [1, 2]
    clock[0] += 10.0
    assert buf.due() is False  # empty buffers are never due, however old
    buf.add({"step": 3, "loss": 0.8})
    assert buf.due() is False  # the clock restarts with the first row after a take
    clock[0] += 1.0
    assert buf.due() is True


def test_buffer_merge_keeps_values_that_a_later_row_leaves_empty(clock):
    buf = MetricBuffer()
    buf.add({"step": 4, "loss": 1.0, "nonfinite": "grad_norm", "grad_norm": None})
    buf.add({"step": 4, "loss": None, "eval_loss": 2.0, "nonfinite": ""})
    assert buf.take() == [{"step": 4, "loss": 1.0, "nonfinite": "grad_norm", "eval_loss": 2.0}]


# ---------------------------------------------------------------------- the handler table
def test_every_kind_handles_every_lifecycle_event_and_training_its_own():
    assert set(HANDLERS) == set(JobKind)  # a new kind gets its row here, or this fails
    for kind, table in HANDLERS.items():
        assert set(LIFECYCLE) <= set(table), kind
    assert set(HANDLERS[JobKind.TRAIN]) == {"status", "warning", "complete", "error", "heartbeat", "progress",
                                            "eval", "checkpoint", "sample", "data"}


def _tracker(tmp_path, kind: JobKind) -> Tracker:
    live = LiveRun("r1", "run", RunStatus.RUNNING)
    return Tracker("r1", tmp_path, live, 0, lock_fh=None, kind=kind)


def test_an_event_its_kind_does_not_report_is_a_timeline_warning_not_a_crash(tmp_path, monkeypatch):
    no_progress = {k: v for k, v in HANDLERS[JobKind.TRAIN].items() if k != "progress"}
    monkeypatch.setitem(HANDLERS, JobKind.TRAIN, no_progress)  # as a kind without progress events would be
    t = _tracker(tmp_path, JobKind.TRAIN)
    pump.handle(t, ev.ProgressEvent(step=1, total_steps=2, loss=1.0))
    assert [(kind, message) for _, kind, message in t.timeline] == [
        ("warning", "a train job does not report 'progress' events: skipped one")]
    assert t.buffer.take() == [] and t.urgent is True


def test_handlers_fill_the_tracker_from_events(tmp_path):
    t = _tracker(tmp_path, JobKind.TRAIN)
    pump.handle(t, ev.ProgressEvent(step=3, total_steps=10, loss=0.5))
    pump.handle(t, ev.EvalEvent(step=3, eval_loss=0.75))
    out = str(tmp_path / "adapter")  # inside the run folder (issue 24: a path outside it is not stored)
    pump.handle(t, ev.CompleteEvent(status="completed", steps=3, final_loss=0.5, output_dir=out))
    [row] = t.buffer.take()  # the progress and eval rows of step 3 merged into one
    assert (row["step"], row["loss"], row["eval_loss"]) == (3, 0.5, 0.75)
    assert t.run_values["steps_done"] == 3 and t.run_values["best_eval_loss"] == 0.75
    assert t.terminal == (RunStatus.COMPLETED, {"final_loss": 0.5, "steps_done": 3, "output_dir": out})


def test_the_data_a_worker_loaded_becomes_the_runs_recorded_fingerprint(tmp_path):
    """Resume compares against what the worker trained on (issue 31 #15), not against what was checked at submit."""
    t = _tracker(tmp_path, JobKind.TRAIN)
    pump.handle(t, ev.DataEvent(fingerprint="f" * 32, rows=3, eval_rows=1, ts=5.0))
    assert t.run_values["data_fingerprint"] == "f" * 32
    assert t.timeline == [(5.0, "data", "loaded 3 training rows and 1 eval row (data fingerprint ffffffffffff)")]
