"""A run adopted by an orchestrator that did not start it (a restarted server, the CLI): it is settled only once its
worker has exited, like a run started here, so the queue never starts the next job while the previous worker still
holds its memory (on a GPU host, its VRAM)."""
from __future__ import annotations

import textwrap

import pytest

from tests.support import FakeLauncher, wait_until
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus

# Writes its outcome, then tears down until the test lets it exit (the real worker frees a model, CUDA, threads).
TEARS_DOWN = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from trainer_core.protocol import events as ev
    run_dir = Path(sys.argv[1])
    out = ev.EventWriter(run_dir / ev.LOG_NAME)
    out.emit(ev.StatusEvent(status="running", phase="training"))
    out.emit(ev.CompleteEvent(status="completed", steps=0, final_loss=None))
    out.close()
    while not (run_dir / "exit-now").exists():
        time.sleep(0.01)
""")


@pytest.fixture
def tearing_down(home, monkeypatch):
    launcher = FakeLauncher(TEARS_DOWN)
    yield launcher
    launcher.kill_all()


def test_an_adopted_run_is_settled_only_once_its_worker_has_exited(store, tearing_down):
    first = Orchestrator(store=store, launcher=tearing_down, start_pump=False)
    run_id = first.start(TrainConfig(model_name=BUNDLED_MODEL, run_name="tears down", max_steps=1))
    first.close()  # the server (or the CLI's `run`) goes away before reading anything; the worker goes on

    second = Orchestrator(store=store, launcher=tearing_down, start_pump=False)  # pumped by hand, tick by tick
    try:
        wait_until(lambda: second.pump_once() or second.snapshot(run_id).status is RunStatus.COMPLETED,
                   what="the complete event read")
        second.pump_once()
        assert tearing_down.spawned[-1].poll() is None  # it is still tearing down: the test has not let it exit
        assert store.get_run(run_id).status is RunStatus.RUNNING  # not settled: its worker still holds its memory
        assert second.active_run_id() == run_id
        (paths.run_dir(run_id) / "exit-now").touch()
        wait_until(lambda: second.pump_once() or store.get_run(run_id).status.is_terminal(), timeout=30,
                   what="the run settled once its worker exited")
    finally:
        second.close()
    assert store.get_run(run_id).status is RunStatus.COMPLETED, store.get_run(run_id).error


def test_an_orchestrator_closed_while_a_finished_worker_exits_leaves_the_run_to_the_next(store, tearing_down):
    first = Orchestrator(store=store, launcher=tearing_down, start_pump=False)
    run_id = first.start(TrainConfig(model_name=BUNDLED_MODEL, run_name="tears down", max_steps=1))
    wait_until(lambda: first.pump_once() or first.snapshot(run_id).status is RunStatus.COMPLETED,
               what="the complete event read")
    first.close()
    assert tearing_down.spawned[-1].poll() is None
    assert store.get_run(run_id).status is RunStatus.RUNNING  # the queue must not count its device as free yet

    second = Orchestrator(store=store, launcher=tearing_down, start_pump=False)
    try:
        (paths.run_dir(run_id) / "exit-now").touch()
        wait_until(lambda: second.pump_once() or store.get_run(run_id).status.is_terminal(), timeout=30,
                   what="the run settled once its worker exited")
    finally:
        second.close()
    assert store.get_run(run_id).status is RunStatus.COMPLETED, store.get_run(run_id).error
