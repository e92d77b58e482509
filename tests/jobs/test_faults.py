"""Durability under faults: workers killed with SIGKILL at random moments (before their first event, mid-run,
right after their last) and orchestrators closed and rebuilt around them (a server restart that adopts the
run). Afterwards the database must agree with each run's durable event log: no run left active, one metric
row per step, every progress and eval value present with the same number, the status the log implies.

The fast part starts ``tests/support/fake_worker.py`` through tests/support/fakes.py's ``FakeLauncher`` (the real
launcher's environment and session); a slow variant kills a real worker training the tiny model.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from db.store import Store
from tests.support import MODELS_CACHE, ROOT, build_tiny_model, fake, wait_for_step, wait_until
from trainer_core.protocol import events as ev
from trainer_core.protocol import paths
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol.status import RunStatus

RUNS = 24
KILLS = ("before-first-event", "mid-run", "after-complete", "none")
RESTARTS = (None, "while-running", "while-down")


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the worker leads its own process group
    except ProcessLookupError:
        pass


# ====================================================================== the invariants
def logged(run_dir: Path) -> tuple[dict[int, float], dict[int, float], str | None, int]:
    """From the event log: loss per step, eval loss per step, the terminal status, bytes of whole lines."""
    try:
        data = (run_dir / "events.jsonl").read_bytes()
    except FileNotFoundError:
        return {}, {}, None, 0
    whole = data[: data.rfind(b"\n") + 1]
    losses, evals, terminal = {}, {}, None
    for line in whole.splitlines():
        event = ev.decode(line.decode())
        if isinstance(event, ev.ProgressEvent):
            losses[event.step] = event.loss
        elif isinstance(event, ev.EvalEvent):
            evals[event.step] = event.eval_loss
        elif isinstance(event, (ev.CompleteEvent, ev.ErrorEvent)) and terminal is None:
            terminal = event.status if isinstance(event, ev.CompleteEvent) else RunStatus.FAILED.value
    return losses, evals, terminal, len(whole)


def assert_database_matches_log(store, run_id: str) -> str:
    """The invariants for one finished run; returns its status."""
    run = store.get_run(run_id)
    losses, evals, terminal, size = logged(paths.run_dir(run_id))
    assert RunStatus(run.status).is_terminal(), f"{run_id} left {run.status}"
    assert run.status == (terminal or RunStatus.FAILED.value), f"{run_id}: {run.status} but the log says {terminal}"
    if terminal is None:
        assert run.error.startswith("The worker"), run.error  # killed: the reason names the worker's end
    assert run.event_offset == size, "every whole line of the log was consumed, none twice"
    frame = store.metrics_frame(run_id)
    assert frame["step"].is_unique and frame["step"].is_monotonic_increasing
    assert sorted(frame["step"]) == sorted(set(losses) | set(evals))
    by_step = frame.set_index("step")
    for step, loss in losses.items():
        assert by_step.loc[step, "loss"] == loss, f"{run_id} step {step}"
    for step, eval_loss in evals.items():
        assert by_step.loc[step, "eval_loss"] == eval_loss, f"{run_id} eval at step {step}"
    if losses:
        assert run.steps_done == max(losses)
    return run.status


def _has_complete_line(run_dir: Path) -> bool:
    try:
        return b'"kind":"complete"' in (run_dir / "events.jsonl").read_bytes()
    except FileNotFoundError:
        return False


# ====================================================================== random kills and restarts (fast)
PINNED_SEED = 20261201
def test_random_kills_and_restarts_keep_the_database_in_step_with_the_log(home, store, fake_launcher, monkeypatch):
    seed = int(os.environ.get("FAULT_SEED") or PINNED_SEED)  # pinned: every run injects the same faults
    print(f"fault seed {seed} (set FAULT_SEED to try others)")
    rng = random.Random(seed)
    plans = [(KILLS[i % len(KILLS)], RESTARTS[(i // len(KILLS)) % len(RESTARTS)]) for i in range(RUNS)]
    rng.shuffle(plans)  # every kill meets every restart kind; the order and the moments are random
    monkeypatch.setenv("FAKE_SEED", str(seed))
    orch = Orchestrator(store=store, launcher=fake_launcher)
    outcomes: dict[str, tuple[str, str | None]] = {}
    try:
        for index, (kill, restart) in enumerate(plans):
            monkeypatch.setenv("FAKE_STEPS", str(rng.randint(3, 40)))
            monkeypatch.setenv("FAKE_DELAY", str(rng.choice([0.0, 0.005, 0.02])))
            monkeypatch.setenv("FAKE_START_DELAY", "1.0" if kill == "before-first-event" else "0")
            monkeypatch.setenv("FAKE_LINGER", "1.0" if kill == "after-complete" else "0")
            run_id = orch.start(TrainConfig(model_name=BUNDLED_MODEL, run_name=f"fault {index}", max_steps=40))
            run_dir = paths.run_dir(run_id)
            pid = store.get_run(run_id).pid
            if kill == "before-first-event":
                _kill(pid)
            if restart == "while-running":
                time.sleep(rng.uniform(0.0, 0.3))
                orch.close()
                orch = Orchestrator(store=store, launcher=fake_launcher)  # the restarted server adopts the run
            if restart == "while-down":
                orch.close()
            if kill == "mid-run":
                time.sleep(rng.uniform(0.0, 0.5))
                _kill(pid)
            elif kill == "after-complete":
                wait_until(lambda d=run_dir: _has_complete_line(d), timeout=30, what=f"the complete event of {run_id}")
                _kill(pid)  # the worker is still tearing down (FAKE_LINGER)
            if restart == "while-down":
                time.sleep(rng.uniform(0.0, 0.3))
                orch = Orchestrator(store=store, launcher=fake_launcher)
            orch.wait(run_id, timeout=60, interval=0.05)
            outcomes[run_id] = (kill, restart)
    finally:
        orch.close()

    assert store.active_runs() == []
    statuses = {run_id: assert_database_matches_log(store, run_id) for run_id in outcomes}
    assert len(statuses) == RUNS
    for run_id, (kill, _) in outcomes.items():
        size = logged(paths.run_dir(run_id))[3]
        if kill == "before-first-event":
            assert size == 0 and statuses[run_id] == RunStatus.FAILED.value, run_id
            assert store.get_run(run_id).error.startswith("The worker was killed by SIGKILL") or \
                store.get_run(run_id).error.startswith("The worker process disappeared"), store.get_run(run_id).error
        elif kill in ("after-complete", "none"):
            assert statuses[run_id] == RunStatus.COMPLETED.value, run_id  # the outcome in the log wins over the kill
    assert RunStatus.FAILED.value in statuses.values() and RunStatus.COMPLETED.value in statuses.values()


# A dashboard process of its own, with the same fake-worker swap, that starts one run and then idles.
SERVER = """
import time
from tests.support import FakeLauncher
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.jobs.orchestrator import Orchestrator

orch = Orchestrator(launcher=FakeLauncher())
print(orch.start(TrainConfig(model_name=BUNDLED_MODEL, run_name="abandoned", max_steps=400)), flush=True)
time.sleep(600)
"""


def test_server_killed_without_close_is_adopted_by_the_next_one(home, monkeypatch):
    """SIGKILL the dashboard process itself mid-run: no close(), no last flush. The next server adopts the
    still-running worker and ends up with exactly what the log holds."""
    monkeypatch.setenv("FAKE_STEPS", "400")
    monkeypatch.setenv("FAKE_DELAY", "0.005")
    go = home.parent / "go"
    monkeypatch.setenv("FAKE_PAUSE_AT", "20")  # the worker waits at step 20 until the server is dead
    monkeypatch.setenv("FAKE_PAUSE_UNTIL", str(go))
    server = subprocess.Popen([sys.executable, "-c", SERVER], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    store = Store()
    run_id = None
    try:
        run_id = server.stdout.readline().strip()
        assert run_id, "the server did not start a run"
        wait_until(lambda: store.get_run(run_id).steps_done >= 20, timeout=30, what="step 20 in the database")
        server.kill()  # the worker is in its own session: it keeps training
        server.wait(timeout=10)
        assert not RunStatus(store.get_run(run_id).status).is_terminal()
        go.touch()
        second = Orchestrator(store=store)
        try:
            second.wait(run_id, timeout=60, interval=0.05)
        finally:
            second.close()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)
        worker = store.get_run(run_id) if run_id else None
        if worker is not None and worker.pid and not RunStatus(worker.status).is_terminal():
            _kill(worker.pid)
    assert assert_database_matches_log(store, run_id) == RunStatus.COMPLETED.value
    assert store.get_run(run_id).steps_done == 400


def test_backlog_larger_than_one_read_is_drained_before_deciding(home, store, fake_launcher, monkeypatch):
    # The pump reads at most 4 MiB per call; a 64 KiB chunk reproduces the same boundary with 2,000 events.
    monkeypatch.setattr(ev, "READ_BYTES", 64 * 1024)
    monkeypatch.setenv("FAKE_STEPS", "2000")
    monkeypatch.setenv("FAKE_DELAY", "0")
    first = Orchestrator(store=store, launcher=fake_launcher)
    run_id = first.start(TrainConfig(model_name=BUNDLED_MODEL, run_name="backlog", max_steps=2000))
    first.close()  # the server goes down at once; the worker finishes on its own
    assert fake_launcher.spawned[-1].wait(timeout=60) == 0
    second = Orchestrator(store=store, launcher=fake_launcher)  # the restarted server finds a dead worker and a long unread log
    try:
        second.wait(run_id, timeout=60, interval=0.05)
    finally:
        second.close()
    assert assert_database_matches_log(store, run_id) == RunStatus.COMPLETED.value


# ====================================================================== a real worker (slow)
@pytest.mark.train
def test_a_checkpoint_half_written_by_a_killed_worker_is_removed_and_never_resumed_from(orch, fake_worker, tmp_path,
                                                                                           monkeypatch):
    """kill -9 during a checkpoint write left checkpoint-N without (or with half of) its trainer_state.json for
    ever. Once the worker is gone, whoever pumps the run removes it as the worker removes tmp-checkpoint-N
    partials: numeric suffixes only, never through a symlink, never outside the run."""
    monkeypatch.setenv("FAKE_PAUSE_AT", "2")  # held mid-run until killed
    monkeypatch.setenv("FAKE_PAUSE_UNTIL", str(tmp_path / "never"))
    run_id = orch.start(fake(monkeypatch, steps=5, checkpoints=""))
    wait_for_step(orch, run_id, 2)
    folder = paths.run_dir(run_id) / "checkpoints"
    done = folder / "checkpoint-1"
    half = folder / "checkpoint-2"  # killed before trainer_state.json
    torn = folder / "checkpoint-3"  # killed while writing it
    for checkpoint in (done, half, torn, folder / "tmp-checkpoint-4"):
        checkpoint.mkdir(parents=True)
        (checkpoint / "adapter_model.safetensors").write_bytes(b"weights")
    (done / "trainer_state.json").write_text('{"global_step": 1}')
    (torn / "trainer_state.json").write_text('{"global_step": 3, "log_hi')
    elsewhere = tmp_path / "elsewhere" / "checkpoint-9"
    elsewhere.mkdir(parents=True)
    (elsewhere / "keep.bin").write_bytes(b"mine")
    (folder / "checkpoint-9").symlink_to(elsewhere, target_is_directory=True)
    (folder / "checkpoint-final").mkdir()

    _kill(orch.get_run(run_id).pid)
    assert orch.wait(run_id, timeout=30, interval=0.05).status is RunStatus.FAILED
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint-1", "checkpoint-9", "checkpoint-final"]
    assert (elsewhere / "keep.bin").read_bytes() == b"mine"
    assert any("checkpoint-2" in e.message and "checkpoint-3" in e.message for e in orch.events(run_id))

    monkeypatch.delenv("FAKE_PAUSE_AT")
    resumed = orch.resume(run_id)
    assert orch.run_config(resumed)["resume_from_checkpoint"] == str(done)
    orch.wait(resumed, timeout=30, interval=0.05)


def test_real_worker_killed_mid_training(tmp_path, monkeypatch, store):
    monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FINETUNE_STUDIO_MODELS", str(MODELS_CACHE))
    monkeypatch.setenv("FINETUNE_STUDIO_FORCE_CPU", "1")
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp_path}:{ROOT / '.test-cache'}")
    monkeypatch.delenv("DATABASE_URL", raising=False)
    tiny = build_tiny_model()
    orch = Orchestrator(store=store)
    try:
        run_id = orch.start(TrainConfig(model_name=str(tiny), max_steps=400, batch_size=2, max_seq_length=64,
                                        warmup_steps=0, eval_fraction=0.1, eval_steps=2, save_steps=3))
        wait_until(lambda: (orch.snapshot(run_id).step or 0) >= 5 or orch.snapshot(run_id).status.is_terminal(),
                   timeout=240, what="step 5 of the real worker")
        assert not orch.snapshot(run_id).status.is_terminal(), orch.log_tail(run_id)
        _kill(store.get_run(run_id).pid)
        snap = orch.wait(run_id, timeout=60, interval=0.1)
    finally:
        orch.close()
    assert snap.status is RunStatus.FAILED
    assert store.get_run(run_id).error == ("The worker was killed by SIGKILL (often the out-of-memory killer) "
                                           "before finishing.")
    assert assert_database_matches_log(store, run_id) == RunStatus.FAILED.value
    losses, evals, _, _ = logged(paths.run_dir(run_id))
    assert len(losses) >= 5 and len(evals) >= 2  # real progress and eval events were compared above
