"""Launchers behind one interface: the orchestrator starts, follows, stops, kills and adopts a job only through
``Launcher``/``JobHandle`` (a launcher with no local process at all runs a job end to end), and the local
launcher answers liveness from the process handle or the recorded pid and start time."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from tests.support import wait_until
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.jobs import adoption
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.launchers import JobHandle, JobState, Launcher
from trainer_core.launchers.local import DISAPPEARED, NEVER_STARTED, LocalHandle, LocalLauncher, started_at
from trainer_core.protocol import events as ev
from trainer_core.protocol.status import RunStatus


class ScriptedHandle(JobHandle):
    """A worker somewhere else: the test writes its events and decides when it ends."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.alive, self.calls = run_dir, True, []

    def record(self) -> dict:
        return {}  # nothing local to remember: no pid

    def state(self) -> JobState:
        return JobState(True) if self.alive else JobState(False, "ended by the scripted launcher")

    def request_stop(self) -> None:
        self.calls.append("request_stop")  # ignored, like a worker that hangs

    def kill(self) -> None:
        self.calls.append("kill")
        self.alive = False


class ScriptedLauncher(Launcher):
    def __init__(self, finish: bool):
        self.finish, self.handles, self.adopted = finish, {}, []

    def start(self, run_dir: Path, cfg) -> ScriptedHandle:
        out = ev.EventWriter(run_dir / ev.LOG_NAME)
        out.emit(ev.StatusEvent(status="running", phase="training", engine="scripted"))
        out.emit(ev.ProgressEvent(step=1, total_steps=2, epoch=0.5, loss=1.5))
        handle = self.handles[run_dir.name] = ScriptedHandle(run_dir)
        if self.finish:
            out.emit(ev.ProgressEvent(step=2, total_steps=2, epoch=1.0, loss=0.5))
            out.emit(ev.CompleteEvent(status="completed", output_dir=str(run_dir / "adapter"), steps=2,
                                      final_loss=0.5))
            handle.started_here = True
            handle.alive = False
        return handle

    def adopt(self, run) -> ScriptedHandle:
        self.adopted.append(run.id)
        return self.handles[run.id]


def config() -> TrainConfig:
    return TrainConfig(run_name="scripted", model_name=BUNDLED_MODEL, max_steps=2)


def test_a_launcher_without_local_processes_runs_a_job_to_completion(home, store):
    launcher = ScriptedLauncher(finish=True)
    orch = Orchestrator(store=store, launcher=launcher)
    try:
        run_id = orch.start(config())
        snap = orch.wait(run_id, timeout=30, interval=0.05)
        run = orch.get_run(run_id)
        assert (snap.status, run.steps_done, run.final_loss, run.pid, run.engine) == (
            RunStatus.COMPLETED, 2, 0.5, None, "scripted")
    finally:
        orch.close()


def test_after_a_restart_the_job_is_adopted_and_stopped_then_killed_through_its_handle(home, store, monkeypatch):
    monkeypatch.setattr(adoption, "STOP_TIMEOUT_S", 0.0)
    monkeypatch.setattr(adoption, "KILL_GRACE_S", 0.0)
    launcher = ScriptedLauncher(finish=False)
    first = Orchestrator(store=store, launcher=launcher)
    run_id = first.start(config())
    wait_until(lambda: first.snapshot(run_id).step == 1, what="step 1")
    first.close()  # the server goes away; the worker (the scripted handle) lives on

    second = Orchestrator(store=store, launcher=launcher)
    try:
        wait_until(lambda: launcher.adopted == [run_id], what="adoption through the launcher")
        second.stop(run_id)
        snap = second.wait(run_id, timeout=30, interval=0.05)
        assert snap.status is RunStatus.FAILED
        assert second.get_run(run_id).error == ("The worker did not stop within 0s and was terminated "
                                                "(ended by the scripted launcher).")
        assert launcher.handles[run_id].calls == ["request_stop", "kill"]
    finally:
        second.close()


class SleepLauncher(LocalLauncher):
    """The local launcher running a plain Python command instead of a worker."""

    def __init__(self, code: str):
        self.code = code

    def environment(self, run_dir, cfg, processes):
        return {"PATH": os.environ.get("PATH", "")}

    def command(self, run_dir, processes):
        return [sys.executable, "-c", self.code]


@pytest.mark.parametrize("code, reason", [
    ("import sys; sys.exit(3)", "exited with code 3"),
    ("import time; time.sleep(60)", "was killed by SIGKILL (often the out-of-memory killer)"),
])
def test_the_local_handle_reports_how_its_process_ended(tmp_path, code, reason):
    handle = SleepLauncher(code).start(tmp_path, config())
    assert handle.started_here and handle.record() == {"pid": handle.pid, "pid_started_at": started_at(handle.pid)}
    if "sleep" in code:
        assert handle.state() == JobState(True)
        handle.kill()
    wait_until(lambda: not handle.state().alive, what="the process to end")
    assert handle.state() == JobState(False, reason)
    assert handle.proc.returncode == (3 if "exit" in code else -signal.SIGKILL)


def test_an_adopted_local_worker_is_its_pid_and_start_time(tmp_path):
    me = os.getpid()
    assert LocalHandle(me, started_at(me)).state() == JobState(True)
    assert LocalHandle(me, started_at(me) - 100).state() == JobState(False, DISAPPEARED)  # a reused pid
    assert LocalHandle(None, None).state() == NEVER_STARTED
    assert not LocalHandle(me, started_at(me)).started_here
