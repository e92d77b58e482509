"""The pump against a hostile event log: lines that are forged or ill-typed, and a log (or the whole run
folder) deleted while the worker trains. The pump is driven with ``pump_once()`` so no assertion depends
on timing; the fake worker (tests/support/fake_worker.py) is started by tests/support/fakes.py's ``FakeLauncher``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import psutil

from db.entities import RunRecord
from trainer_core.protocol import events as ev, paths
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol.status import RunStatus


def pump_until(orch: Orchestrator, predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        orch.pump_once()
        time.sleep(0.01)


def timeline(store, run_id: str, kind: str) -> list[str]:
    return [e.message for e in store.get_events(run_id) if e.kind == kind]


def terminal(store, run_id: str) -> bool:
    return RunStatus(store.get_run(run_id).status).is_terminal()


# ====================================================================== forged and ill-typed lines (9.3.3)
def test_invalid_lines_become_timeline_warnings_and_nothing_else_is_lost(home, store):
    """A live run whose log holds a forged complete line, an ill-typed step and garbage between valid
    events: each bad line is skipped on its own, named in the timeline, and the run ends as its log says once its
    worker has exited."""
    run_id = "forged"
    worker = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    store.create_run(RunRecord(id=run_id, name="forged log", status=RunStatus.RUNNING.value, created_at=time.time(),
                         started_at=time.time(), total_steps=3, pid=worker.pid,
                         pid_started_at=psutil.Process(worker.pid).create_time()))
    run_dir = paths.run_dir(run_id)
    run_dir.mkdir(parents=True)
    lines = [
        ev.encode(ev.StatusEvent(status="running", phase="training", ts=1.0)),
        ev.encode(ev.ProgressEvent(step=1, total_steps=3, loss=2.5, ts=2.0)),
        '{"kind":"complete","status":"running"}',
        '{"kind":"progress","step":"x","total_steps":3,"loss":1.0}',
        ev.encode(ev.ProgressEvent(step=2, total_steps=3, loss=2.0, ts=3.0)),
        ev.encode(ev.EvalEvent(step=2, eval_loss=2.2, ts=3.5)),
        '{"kind":"status","status":"completed"}',
        "not json at all",
        ev.encode(ev.ProgressEvent(step=3, total_steps=3, loss=1.5, ts=4.0)),
        ev.encode(ev.CompleteEvent(status="completed", steps=3, final_loss=1.5, ts=5.0)),
    ]
    (run_dir / "events.jsonl").write_text("\n".join(lines) + "\n")
    orch = Orchestrator(store=store, start_pump=False)
    try:
        pump_until(orch, lambda: orch.snapshot(run_id).status is RunStatus.COMPLETED, "the complete event read")
        worker.stdin.close()  # the worker exits
        worker.wait()
        pump_until(orch, lambda: terminal(store, run_id), "the forged run to end")
    finally:
        orch.close()
        worker.kill()
        worker.wait()
    run = store.get_run(run_id)
    assert run.status == RunStatus.COMPLETED.value, run.error
    assert run.final_loss == 1.5 and run.steps_done == 3
    frame = store.metrics_frame(run_id)
    assert frame["step"].tolist() == [1, 2, 3]
    assert frame["loss"].tolist() == [2.5, 2.0, 1.5]
    assert frame.set_index("step").loc[2, "eval_loss"] == 2.2
    assert run.event_offset == (run_dir / "events.jsonl").stat().st_size
    warnings = timeline(store, run_id, "warning")
    assert len(warnings) == 4, warnings
    assert "'status' is 'running'" in warnings[0] and "complete" in warnings[0]
    assert "'step' is 'x'" in warnings[1]
    assert "'status' is 'completed'" in warnings[2]
    assert "not json at all" in warnings[3]


# ====================================================================== a log deleted while training (9.3.1)
def test_deleting_the_event_log_while_training_loses_nothing(home, store, fake_launcher, monkeypatch):
    monkeypatch.setenv("FAKE_STEPS", "150")
    monkeypatch.setenv("FAKE_DELAY", "0.01")
    orch = Orchestrator(store=store, launcher=fake_launcher, start_pump=False)
    try:
        run_id = orch.start(TrainConfig(model_name=BUNDLED_MODEL, run_name="deleted log", max_steps=150))
        log = paths.run_dir(run_id) / "events.jsonl"
        pump_until(orch, lambda: orch.snapshot(run_id).step >= 5, "the first steps")
        kept = log.read_bytes()  # what the worker wrote so far; it keeps appending to the unlinked file
        log.unlink()
        assert fake_launcher.spawned[-1].wait(timeout=60) == 0
        pump_until(orch, lambda: terminal(store, run_id), "the run to end")
    finally:
        orch.close()
    run = store.get_run(run_id)
    assert run.status == RunStatus.COMPLETED.value, run.error
    assert run.steps_done == 150
    frame = store.metrics_frame(run_id)
    assert frame["step"].tolist() == list(range(1, 151))
    assert frame["step"].is_unique
    assert run.event_offset > len(kept)  # the pump went on reading past the point where the file vanished
    assert any("events.jsonl was deleted" in m for m in timeline(store, run_id, "warning"))


def test_stop_works_after_the_whole_run_folder_was_deleted(home, store, fake_launcher, monkeypatch):
    # Unsandboxed: a sandboxed worker sees its folder through a bind mount, so a folder recreated under the same name
    # is not its own and the request cannot reach it (the watchdog ends it: test_sandbox.py)
    monkeypatch.setenv("FINETUNE_STUDIO_SANDBOX", "off")
    monkeypatch.setenv("FAKE_STEPS", "100000")
    monkeypatch.setenv("FAKE_DELAY", "0.01")
    orch = Orchestrator(store=store, launcher=fake_launcher, start_pump=False)
    try:
        run_id = orch.start(TrainConfig(model_name=BUNDLED_MODEL, run_name="deleted folder", max_steps=100000))
        run_dir = paths.run_dir(run_id)
        pump_until(orch, lambda: orch.snapshot(run_id).step >= 3, "the first steps")
        shutil.rmtree(run_dir)
        pump_until(orch, lambda: orch.snapshot(run_id).step >= 10, "steps after the folder was deleted")
        orch.stop(run_id)  # crashed with FileNotFoundError in control.py
        assert json.loads((run_dir / "control.json").read_text())["action"] == "stop"
        pump_until(orch, lambda: terminal(store, run_id), "the stopped run to end")
    finally:
        orch.close()
    run = store.get_run(run_id)
    assert run.status == RunStatus.STOPPED.value, run.error
    frame = store.metrics_frame(run_id)
    assert frame["step"].tolist() == list(range(1, run.steps_done + 1)) and run.steps_done >= 10
    warnings = timeline(store, run_id, "warning")
    assert any("events.jsonl was deleted" in m for m in warnings), warnings
    assert any("was missing: recreated it" in m for m in warnings), warnings
    assert timeline(store, run_id, "control") == ["stop requested"]
    assert os.path.isdir(run_dir)
