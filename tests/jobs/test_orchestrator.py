"""Orchestrator lifecycle without the ML stack: tests/support/fakes.py's ``FakeLauncher`` (the real launcher's
environment, own session and worker.log) starts a fake worker that writes real events with ``EventWriter``;
everything else is the real pump, store and control path. Behaviour of the fake is chosen per test through
FAKE_* environment variables, which the launcher passes on like any other variable.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest
from sqlmodel import Session

from db.models import Metric
from tests.support import ROOT, fake, orphan_run, run_python, wait_for_step, wait_until
from trainer_core.__main__ import main as cli
from trainer_core.jobs import adoption
from trainer_core.protocol import control, paths
from trainer_core.config import BUNDLED_DATASET, BUNDLED_MODEL, TrainConfig
from trainer_core.jobs.orchestrator import Orchestrator, with_absolute_paths
from trainer_core.protocol.status import RunStatus

ML_STACK = ("torch", "transformers", "peft", "trl", "unsloth")
ML_IMPORTED_BEFORE = sorted(m for m in ML_STACK if m in sys.modules)  # by another test module, if any

FIXTURES = ROOT / "tests" / "fixtures" / "datasets"

# ====================================================================== helpers
def pid_of(orch: Orchestrator, run_id: str) -> int:
    return orch.get_run(run_id).pid


def timeline(orch: Orchestrator, run_id: str, kind: str) -> list[str]:
    return [e.message for e in orch.events(run_id) if e.kind == kind]


# ====================================================================== happy path
def test_completed_run_stores_metrics_timeline_and_offset(orch, monkeypatch):
    cfg = fake(monkeypatch, steps=5, nan_step="3", evals="4:0.75", checkpoints="4")
    run_id = orch.start(cfg)
    snap = orch.wait(run_id, timeout=30, interval=0.1)

    run = orch.get_run(run_id)
    assert run.status == RunStatus.COMPLETED.value, f"{run.error}\n{orch.log_tail(run_id)}"
    assert run.steps_done == 5 and run.total_steps == 5
    assert run.final_loss == pytest.approx(2.0 / 5)
    assert run.best_eval_loss == pytest.approx(0.75)
    assert run.engine == "fake" and run.error == ""
    assert run.output_dir == str(paths.run_dir(run_id) / "adapter")
    assert run.event_offset == (paths.run_dir(run_id) / "events.jsonl").stat().st_size

    frame = orch.metrics(run_id)
    assert list(frame["step"]) == [1, 2, 3, 4, 5]  # one row per step; the eval row merged into step 4
    by_step = frame.set_index("step")
    assert by_step.loc[3, "nonfinite"] == "loss" and by_step["loss"].isna().tolist() == [False, False, True, False, False]
    assert by_step.loc[4, "loss"] == pytest.approx(0.5) and by_step.loc[4, "eval_loss"] == pytest.approx(0.75)
    assert by_step["eval_loss"].notna().tolist() == [False, False, False, True, False]
    assert (by_step.drop(index=3)["nonfinite"] == "").all()
    with Session(orch.store.engine) as session:
        nan_row = session.get(Metric, (run_id, 3))
    assert nan_row.loss is None  # stored as NULL, not as a NaN float

    assert timeline(orch, run_id, "checkpoint") == [
        f"checkpoint saved at step 4: {paths.run_dir(run_id) / 'checkpoints' / 'checkpoint-4'}"]
    assert timeline(orch, run_id, "alert") == ["Train loss is NaN or inf at step 3."]
    assert timeline(orch, run_id, "status")[-1] == RunStatus.COMPLETED.label

    assert snap.status is RunStatus.COMPLETED
    assert snap.step == 5 and snap.eval_loss == pytest.approx(0.75) and snap.finished_at is not None
    assert list(snap.metrics["step"]) == [1, 2, 3, 4, 5]
    assert snap.warnings == ()
    assert [(a.kind, a.step, a.message) for a in snap.alerts] == [
        ("nonfinite_loss", 3, "Train loss is NaN or inf at step 3.")]
    assert orch.alert_counts([run_id]) == {run_id: 1}
    assert orch.snapshot(run_id).status is RunStatus.COMPLETED
    assert orch.active_run_id() is None

    # Stop and cancel of a finished run change nothing.
    orch.stop(run_id)
    orch.cancel(run_id)
    assert control.read(paths.run_dir(run_id)) is None
    assert not (paths.run_dir(run_id) / control.CONTROL_FILE).exists()
    assert timeline(orch, run_id, "control") == []
    assert orch.get_run(run_id).status == RunStatus.COMPLETED.value


# ====================================================================== failures
def test_worker_exit_code_without_terminal_event_fails_with_log(orch, monkeypatch):
    run_id = orch.start(fake(monkeypatch, mode="exit3"))
    snap = orch.wait(run_id, timeout=30, interval=0.1)
    run = orch.get_run(run_id)
    assert snap.status is RunStatus.FAILED and run.status == RunStatus.FAILED.value
    assert run.error == "The worker exited with code 3 before finishing."
    assert snap.error == run.error
    assert "fake worker: cannot go on, exiting with code 3" in run.log_tail
    assert timeline(orch, run_id, "status")[-1] == "Failed: The worker exited with code 3 before finishing."


def test_worker_exception_fails_with_traceback_in_log_tail(orch, monkeypatch):
    run_id = orch.start(fake(monkeypatch, mode="raise"))
    orch.wait(run_id, timeout=30, interval=0.1)
    run = orch.get_run(run_id)
    assert run.status == RunStatus.FAILED.value
    assert run.error == "The worker exited with code 1 before finishing."
    assert "Traceback" in run.log_tail and "RuntimeError: fake worker exploded" in run.log_tail


def test_worker_killed_by_sigkill_fails(orch, monkeypatch):
    run_id = orch.start(fake(monkeypatch, steps=1000, delay=0.05))
    wait_for_step(orch, run_id, 2)
    os.killpg(pid_of(orch, run_id), signal.SIGKILL)
    snap = orch.wait(run_id, timeout=30, interval=0.1)
    run = orch.get_run(run_id)
    assert snap.status is RunStatus.FAILED
    assert run.error == "The worker was killed by SIGKILL (often the out-of-memory killer) before finishing."
    assert 2 <= run.steps_done < 1000
    assert list(orch.metrics(run_id)["step"]) == list(range(1, run.steps_done + 1))


# ====================================================================== stop / cancel
def test_stop_then_cancel_requests_are_durable_and_cancel_wins(orch, monkeypatch):
    run_id = orch.start(fake(monkeypatch, mode="ignore", steps=3, delay=0.3))
    run_dir = paths.run_dir(run_id)
    wait_for_step(orch, run_id, 1)  # the worker's "running" status event has been applied

    orch.stop(run_id)
    assert control.read(run_dir) is control.Action.STOP
    snap = orch.snapshot(run_id)
    assert snap.status is RunStatus.STOPPING and snap.phase == "stopping (saving)"
    orch.cancel(run_id)
    assert control.read(run_dir) is control.Action.CANCEL
    orch.stop(run_id)
    assert control.read(run_dir) is control.Action.CANCEL  # cancel wins over a later stop
    assert timeline(orch, run_id, "control") == ["stop requested", "cancel requested", "stop requested"]

    wait_for_step(orch, run_id, 3)  # more progress from the worker does not flip the status back
    assert orch.snapshot(run_id).status is RunStatus.STOPPING

    os.killpg(pid_of(orch, run_id), signal.SIGKILL)
    orch.wait(run_id, timeout=30, interval=0.1)
    before = (run_dir / control.CONTROL_FILE).read_bytes()
    events_before = len(orch.events(run_id))
    orch.stop(run_id)
    orch.cancel(run_id)
    assert (run_dir / control.CONTROL_FILE).read_bytes() == before
    assert len(orch.events(run_id)) == events_before
    assert orch.get_run(run_id).status == RunStatus.FAILED.value


def test_a_finished_run_no_longer_shows_its_last_phase(orch, monkeypatch):
    """The fake's last status before it ends on Stop is "stopping / saving"; once stopped, that is stale."""
    run_id = orch.start(fake(monkeypatch, steps=1000, delay=0.02))
    wait_for_step(orch, run_id, 2)
    orch.stop(run_id)
    snap = orch.wait(run_id, timeout=30, interval=0.05)
    assert "stopping/saving" in [f"{e.message}".lower().replace(": ", "/") for e in orch.events(run_id)
                                 if e.kind == "status"]
    assert (snap.status, snap.phase) == (RunStatus.STOPPED, "")
    assert orch.get_run(run_id).phase == ""


@pytest.mark.parametrize("action, status", [("stop", RunStatus.STOPPED), ("cancel", RunStatus.CANCELLED)])
def test_worker_honouring_control_ends_stopped_or_cancelled(orch, monkeypatch, action, status):
    run_id = orch.start(fake(monkeypatch, steps=1000, delay=0.05, checkpoints=""))
    wait_for_step(orch, run_id, 2)
    getattr(orch, action)(run_id)
    snap = orch.wait(run_id, timeout=30, interval=0.1)
    run = orch.get_run(run_id)
    assert snap.status is status and run.status == status.value, f"{run.error}\n{orch.log_tail(run_id)}"
    assert 2 <= run.steps_done < 1000 and run.error == ""
    assert list(orch.metrics(run_id)["step"]) == list(range(1, run.steps_done + 1))
    assert timeline(orch, run_id, "control") == [f"{action} requested"]
    saved = timeline(orch, run_id, "checkpoint")
    if action == "stop":
        assert saved == [f"checkpoint saved at step {run.steps_done}: "
                         f"{paths.run_dir(run_id) / 'checkpoints' / f'checkpoint-{run.steps_done}'}"]
    else:
        assert saved == []


def test_watchdog_kills_a_worker_that_ignores_stop(orch, fake_worker, monkeypatch):
    monkeypatch.setattr(adoption, "STOP_TIMEOUT_S", 1.0)
    monkeypatch.setattr(adoption, "KILL_GRACE_S", 0.5)
    run_id = orch.start(fake(monkeypatch, mode="ignore", steps=2))
    wait_for_step(orch, run_id, 2)
    orch.stop(run_id)
    snap = orch.wait(run_id, timeout=30, interval=0.1)
    run = orch.get_run(run_id)
    assert snap.status is RunStatus.FAILED
    assert run.error == ("The worker did not stop within 1s and was terminated "
                         "(was killed by SIGKILL (often the out-of-memory killer)).")
    assert "no response after 1s: sent SIGTERM" in timeline(orch, run_id, "control")
    assert fake_worker.spawned[-1].returncode == -signal.SIGKILL  # SIGTERM was ignored, SIGKILL ended it


def test_stop_request_survives_a_restart_and_the_watchdog_still_fires(make_orch, fake_worker, monkeypatch):
    first = make_orch()
    run_id = first.start(fake(monkeypatch, mode="ignore", steps=2))
    wait_for_step(first, run_id, 2)
    first.stop(run_id)
    first.close()  # the server goes away right after the user pressed Stop
    assert first.store.get_run(run_id).status == RunStatus.STOPPING.value

    monkeypatch.setattr(adoption, "STOP_TIMEOUT_S", 1.0)
    monkeypatch.setattr(adoption, "KILL_GRACE_S", 0.5)
    second = make_orch()
    assert second.snapshot(run_id).status is RunStatus.STOPPING
    snap = second.wait(run_id, timeout=30, interval=0.1)
    assert snap.status is RunStatus.FAILED
    assert second.get_run(run_id).error.startswith("The worker did not stop within 1s and was terminated")


@pytest.mark.parametrize("action", ["stop", "cancel"])
def test_a_request_made_by_another_process_is_enforced_by_whoever_pumps(store, fake_worker, monkeypatch, action):
    """The `stop`/`cancel` CLI (like a second dashboard) only writes control.json and the row: the orchestrator that
    pumps the run shows the request and terminates a worker that ignores it once the same timeout runs out."""
    monkeypatch.setattr(adoption, "STOP_TIMEOUT_S", 3600.0)  # nothing is terminated before the test says so
    monkeypatch.setattr(adoption, "KILL_GRACE_S", 0.0)
    pumping = Orchestrator(store=store, launcher=fake_worker, start_pump=False)  # pumped by hand, tick by tick
    try:
        run_id = pumping.start(fake(monkeypatch, mode="ignore", steps=2))
        wait_until(lambda: pumping.pump_once() or pumping.snapshot(run_id).step >= 2, what="step 2")
        monkeypatch.setenv("DATABASE_URL", store.url)  # the CLI's own orchestrator, on the same database
        assert cli([action, run_id]) == 0
        pumping.pump_once()
        assert pumping.snapshot(run_id).status is RunStatus.STOPPING
        monkeypatch.setattr(adoption, "STOP_TIMEOUT_S", 0.0)  # the timeout runs out
        wait_until(lambda: pumping.pump_once() or store.get_run(run_id).status.is_terminal(), timeout=30,
                   what="the watchdog to end the worker")
    finally:
        pumping.close()
    run = store.get_run(run_id)
    assert run.status is RunStatus.FAILED
    assert run.error.startswith("The worker did not stop within 0s and was terminated"), run.error
    assert "no response after 0s: sent SIGTERM" in [e.message for e in store.get_events(run_id) if e.kind == "control"]
    assert fake_worker.spawned[-1].returncode == -signal.SIGKILL  # SIGTERM was ignored, SIGKILL ended it


# ====================================================================== restart and adoption
def test_new_orchestrator_adopts_a_live_run_without_gaps_or_duplicates(make_orch, fake_worker, monkeypatch):
    first = make_orch()
    run_id = first.start(fake(monkeypatch, steps=30, delay=0.05, nan_step="3", evals="2:0.5,25:0.9",
                              checkpoints="4,25"))
    wait_for_step(first, run_id, 6)
    first.close()  # the server goes away; the worker keeps training

    # The restarted server, pumped by hand: what it shows right after adopting cannot be overtaken by its own
    # pump thread settling the run (the worker may be done by now on a busy machine).
    second = Orchestrator(store=first.store, launcher=fake_worker, start_pump=False)
    try:
        assert second.active_run_id() == run_id
        adopted = second.snapshot(run_id)
        assert adopted is not None and not adopted.status.is_terminal()
        assert len(adopted.metrics) >= 6  # what the first server stored is shown again at once
        wait_until(lambda: second.pump_once() or second.get_run(run_id).status == "completed", timeout=60,
                   what="the adopted run to complete")
        snap = second.wait(run_id, timeout=30, interval=0.1)
    finally:
        second.close()

    run = second.get_run(run_id)
    assert snap.status is RunStatus.COMPLETED and run.status == RunStatus.COMPLETED.value, run.error
    assert run.steps_done == 30 and run.final_loss == pytest.approx(2.0 / 30)
    frame = second.metrics(run_id)
    assert list(frame["step"]) == list(range(1, 31))
    assert frame["loss"].isna().sum() == 1 and frame.set_index("step").loc[3, "nonfinite"] == "loss"
    assert run.event_offset == (paths.run_dir(run_id) / "events.jsonl").stat().st_size
    # Timeline entries are committed together with the offset, so nothing is replayed twice.
    assert timeline(second, run_id, "alert") == ["Train loss is NaN or inf at step 3."]
    assert [m.split(":")[0] for m in timeline(second, run_id, "checkpoint")] == [
        "checkpoint saved at step 4", "checkpoint saved at step 25"]
    assert snap.step == 30 and list(snap.metrics["step"]) == list(range(1, 31))


def test_adoption_keeps_the_best_eval_loss_from_before_the_restart(make_orch, monkeypatch):
    first = make_orch()
    run_id = first.start(fake(monkeypatch, steps=30, delay=0.05, evals="2:0.5,25:0.9", checkpoints=""))
    wait_for_step(first, run_id, 6)
    first.close()
    assert first.get_run(run_id).best_eval_loss == pytest.approx(0.5)
    second = make_orch()
    second.wait(run_id, timeout=30, interval=0.1)
    assert second.get_run(run_id).best_eval_loss == pytest.approx(0.5)


def test_restart_while_a_finished_worker_is_still_exiting_keeps_the_outcome(make_orch, fake_worker, store, monkeypatch):
    first = Orchestrator(store=store, launcher=fake_worker, start_pump=False)  # pumped by hand: the moment below is ours to choose
    run_id = first.start(fake(monkeypatch, steps=3, linger="3"))
    # The pump has read the complete event, but the worker has not exited yet (it tears down for 3 s).
    wait_until(lambda: first.pump_once() or first.snapshot(run_id).status is RunStatus.COMPLETED,
               what="the complete event read")
    assert first.get_run(run_id).status == RunStatus.RUNNING.value  # not settled while the worker is alive
    first.close()
    second = make_orch()
    second.wait(run_id, timeout=30, interval=0.1)
    run = second.get_run(run_id)
    assert run.status == RunStatus.COMPLETED.value, run.error


def test_dead_orphan_is_marked_failed(home, store, make_orch):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(gone.pid).create_time()
    gone.wait()
    dead = orphan_run(store, pid=gone.pid, pid_started_at=started)
    never = orphan_run(store, status=RunStatus.STARTING.value, pid=None)

    orch = make_orch()
    for run_id in (dead, never):
        orch.wait(run_id, timeout=15, interval=0.1)
    assert store.get_run(dead).status == RunStatus.FAILED.value
    assert store.get_run(dead).error == ("The worker process disappeared (it was started by an earlier dashboard; "
                                         "exit code unknown) before finishing.")
    assert orch.snapshot(dead).status is RunStatus.FAILED
    assert store.get_run(never).status == RunStatus.FAILED.value
    assert store.get_run(never).error == "The worker never started (no process id recorded)."
    assert orch.active_run_id() is None


def test_adopted_run_snapshot_shows_the_stored_progress(home, store, make_orch):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(gone.pid).create_time()
    gone.wait()
    run_id = orphan_run(store, pid=gone.pid, pid_started_at=started)
    store.update_run(run_id, steps_done=7, last_loss=0.25, best_eval_loss=0.5)
    orch = make_orch()
    orch.wait(run_id, timeout=15, interval=0.1)
    snap = orch.snapshot(run_id)
    assert (snap.step, snap.loss, snap.eval_loss) == (7, 0.25, 0.5)


def test_orphan_without_run_folder_does_not_break_the_orchestrator(home, store, make_orch):
    run_id = orphan_run(store, pid=None, make_dir=False)
    orch = make_orch()
    orch.wait(run_id, timeout=15, interval=0.1)
    assert store.get_run(run_id).status == RunStatus.FAILED.value


def test_adoption_race_with_a_run_that_just_finished(make_orch, monkeypatch):
    first = make_orch()
    run_id = first.start(fake(monkeypatch, steps=3, nan_step="2", checkpoints="3"))
    stale = [first.get_run(run_id)]  # what another server's active_runs() query saw before the run ended
    first.wait(run_id, timeout=30, interval=0.1)
    monkeypatch.setattr(first.store, "active_runs", lambda: list(stale))
    second = make_orch()  # its __init__ adopts from the stale row; the per-run lock is free again
    for _ in range(3):  # ticks driven here, not slept through: whatever it would do, it has done
        second.pump_once()
    assert timeline(first, run_id, "alert") == ["Train loss is NaN or inf at step 2."]
    assert len(timeline(first, run_id, "checkpoint")) == 1


# ====================================================================== paths and secrets
def test_with_absolute_paths_pins_relative_sources(home, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(FIXTURES / "chatml.jsonl", tmp_path / "data.jsonl")
    cfg = TrainConfig(local_datasets=["data.jsonl", BUNDLED_DATASET], local_eval_datasets=["./data.jsonl"])
    pinned = with_absolute_paths(cfg)
    absolute = str((tmp_path / "data.jsonl").resolve())
    assert pinned.local_datasets == [absolute, BUNDLED_DATASET]
    assert pinned.local_eval_datasets == [absolute]
    assert pinned.model_name == BUNDLED_MODEL
    assert cfg.local_datasets == ["data.jsonl", BUNDLED_DATASET]  # the caller's config is not changed


def test_start_writes_absolute_paths_and_keeps_the_token_out_of_files_and_argv(orch, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(FIXTURES / "chatml.jsonl", tmp_path / "data.jsonl")
    secret = "hf_test_secret"
    cfg = fake(monkeypatch, steps=1000, delay=0.05)
    cfg.local_datasets = ["data.jsonl"]
    cfg.hf_token = secret
    assert cfg.validate() == []
    run_id = orch.start(cfg)
    run_dir = paths.run_dir(run_id)
    wait_for_step(orch, run_id, 1)

    cmdline = psutil.Process(pid_of(orch, run_id)).cmdline()
    assert cmdline[-1] == str(run_dir) and not any(secret in arg for arg in cmdline)
    assert secret.encode() not in Path(f"/proc/{pid_of(orch, run_id)}/cmdline").read_bytes()
    orch.cancel(run_id)
    assert orch.wait(run_id, timeout=30, interval=0.1).status is RunStatus.CANCELLED

    config_text = (run_dir / "config.yaml").read_text()
    assert str((tmp_path / "data.jsonl").resolve()) in config_text
    assert TrainConfig.from_yaml(config_text).local_datasets == [str((tmp_path / "data.jsonl").resolve())]
    assert "hf_token" not in config_text and secret not in config_text
    run = orch.get_run(run_id)
    assert json.loads(run.config_json)["local_datasets"] == [str((tmp_path / "data.jsonl").resolve())]
    assert secret not in run.config_json and secret not in run.error and secret not in run.log_tail
    log = (run_dir / "worker.log").read_text()
    assert "HF_TOKEN set: True" in log and secret not in log  # reached the worker through its environment
    files = [p for p in tmp_path.rglob("*") if p.is_file()]  # the data root, the database and its WAL
    assert run_dir / "events.jsonl" in files
    if orch.store.is_sqlite:
        assert Path(orch.store.url.removeprefix("sqlite:///")) in files
    else:  # PostgreSQL: look at every stored text of this run instead of a file
        stored = [json.dumps(asdict(orch.get_run(run_id)))] + [json.dumps(asdict(e)) for e in orch.events(run_id)]
        assert not any(secret in text for text in stored)
    for path in files:
        assert secret.encode() not in path.read_bytes(), path
    assert cfg.hf_token == secret  # start() did not blank the caller's object either


def test_worker_without_token_gets_no_hf_token_even_if_the_server_has_one(orch, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_server_env_secret")  # the server's own token is not handed down
    run_id = orch.start(fake(monkeypatch, steps=1))
    orch.wait(run_id, timeout=30, interval=0.1)
    assert "HF_TOKEN set: False" in orch.log_tail(run_id)


# ====================================================================== the server never imports the ML stack
def test_orchestrator_module_does_not_import_the_ml_stack():
    result = run_python("import sys, trainer_core.jobs.orchestrator, db.store;"
                        f"print(sorted(m for m in {ML_STACK!r} if m in sys.modules))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_zz_no_ml_stack_in_this_process_after_the_runs_above():
    if ML_IMPORTED_BEFORE:
        pytest.skip(f"another test module imported {ML_IMPORTED_BEFORE} into this process before this one")
    assert [m for m in ML_STACK if m in sys.modules] == []


def test_server_killed_after_the_final_event_was_stored_keeps_the_outcome(make_orch, fake_worker, store, monkeypatch):
    """The pump stored the offset past 'complete' while the worker was still exiting, then the server died
    without settling the run: the next server finds the outcome in the log instead of calling it lost."""
    first = Orchestrator(store=store, launcher=fake_worker, start_pump=False)  # pumped by hand, then "killed"
    run_id = first.start(fake(monkeypatch, steps=3, linger="3"))
    log = paths.run_dir(run_id) / "events.jsonl"
    wait_until(lambda: first.pump_once() or first.snapshot(run_id).status is RunStatus.COMPLETED,
               what="the complete event read")
    assert first.get_run(run_id).event_offset == log.stat().st_size  # stored with the terminal flush
    first._tracked[run_id].lock_fh.close()  # a killed server: nothing is settled, the OS drops its lock
    assert first.get_run(run_id).status != RunStatus.COMPLETED.value
    second = make_orch()
    snap = second.wait(run_id, timeout=30, interval=0.1)
    assert snap.status is RunStatus.COMPLETED, snap.error
    assert second.get_run(run_id).steps_done == 3
