"""The persistent queue, device sets and resume, with tests/support/fake_worker.py (real orchestrator, pump, store,
control and OS locks; only the training is fake)."""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest

from db.entities import RunRecord
from tests.support import fake, orphan_run, run_python, wait_until
from trainer_core.data import fingerprint as data_fp
from trainer_core.jobs import queue as scheduling
from trainer_core.protocol import events as ev
from trainer_core.protocol import paths
from trainer_core.config import TrainConfig
from trainer_core.jobs.orchestrator import Orchestrator, RunRefused
from trainer_core.protocol.status import RunStatus


def statuses(orch: Orchestrator, ids: list[str]) -> list[str]:
    return [orch.get_run(i).status for i in ids]


def assert_never_overlapping(orch: Orchestrator, ids: list[str]) -> None:
    """The runs trained one after another: each started after the previous one finished."""
    spans = sorted((orch.get_run(i).started_at, orch.get_run(i).finished_at) for i in ids)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end, spans


# ====================================================================== scheduling rules
@pytest.mark.parametrize("a,b,expected", [
    ("cpu", "cpu", True), ("gpu0", "gpu1", False), ("gpu0,gpu1", "gpu1", True), ("gpu*", "gpu3", True),
    ("gpu*", "gpu*", True), ("gpu*", "cpu", False), ("", "gpu0", True), ("cpu", "", True)])
def test_overlap(a, b, expected):
    assert scheduling.overlap(a, b) is expected
    assert scheduling.overlap(b, a) is expected


def test_startable_is_first_come_first_served_with_backfill():
    queue = [("a", "gpu0"), ("b", "gpu1"), ("c", "gpu0,gpu2"), ("d", "gpu2"), ("e", "gpu3")]
    # gpu0 is busy: a waits; b takes gpu1; c waits for gpu0; d must not take gpu2 ahead of c; e is free.
    assert scheduling.startable(queue, busy=["gpu0"]) == ["b", "e"]
    assert scheduling.startable([("x", "cpu"), ("y", "cpu")], busy=[]) == ["x"]
    assert scheduling.startable([("x", "gpu*"), ("y", "gpu1")], busy=[]) == ["x"]


def test_devices_of_a_config():
    assert scheduling.devices_of(TrainConfig(), cuda=False) == "cpu"
    assert scheduling.devices_of(TrainConfig(gpu_ids=[1, 0, 1]), cuda=True) == "gpu0,gpu1"
    assert scheduling.devices_of(TrainConfig(), cuda=True) == "gpu*"


# ====================================================================== queue
def test_start_while_busy_queues_and_the_queue_drains_in_order(make_orch, monkeypatch):
    first = make_orch()
    # long enough that it cannot end while the others are started, however busy the machine; stopped below
    running = first.start(fake(monkeypatch, steps=2000, delay=0.05))
    queued = [first.start(fake(monkeypatch, steps=2)) for _ in range(2)]
    second = make_orch()  # a hot reload's second orchestrator queues behind the same run
    queued.append(second.start(fake(monkeypatch, steps=2)))
    assert statuses(first, queued) == ["queued"] * 3
    assert [r.id for r in first.queue()] == queued
    assert first.active_run_id() == running
    first.stop(running)
    assert first.wait(running, timeout=60, interval=0.1).status is RunStatus.STOPPED
    for run_id in queued:
        assert first.wait(run_id, timeout=60, interval=0.1).status is RunStatus.COMPLETED
    assert_never_overlapping(first, [running, *queued])
    starts = [first.get_run(i).started_at for i in queued]
    assert starts == sorted(starts)  # in queue order
    assert all(first.get_run(i).queue_position is None for i in queued)


def test_queued_runs_can_be_reordered_and_removed(orch, monkeypatch):
    running = orch.start(fake(monkeypatch, steps=1000, delay=0.05))
    a, b, c = (orch.start(fake(monkeypatch, steps=1)) for _ in range(3))
    assert orch.move_in_queue(c, -2) is True
    assert [r.id for r in orch.queue()] == [c, a, b]
    assert orch.move_in_queue(c, -5) is True  # clamped at the front
    assert orch.move_in_queue(running, 1) is False  # not queued
    orch.remove_from_queue(a)
    assert orch.get_run(a).status == RunStatus.CANCELLED.value
    assert orch.get_run(a).phase == "removed from the queue"
    assert [r.id for r in orch.queue()] == [c, b]
    orch.cancel(running)
    for run_id in (c, b):
        assert orch.wait(run_id, timeout=60, interval=0.1).status is RunStatus.COMPLETED
    assert orch.get_run(c).started_at < orch.get_run(b).started_at
    assert orch.get_run(a).started_at is None  # a removed run never started
    assert not (paths.run_dir(a) / "events.jsonl").exists()


def test_simultaneous_starts_from_threads_and_two_orchestrators_start_one_run(make_orch, monkeypatch):
    """Eight Start presses at the same instant, from two orchestrators: the OS lock lets one run start."""
    orchs = [make_orch(), make_orch()]
    # the one run that starts must not end while the other presses are still waiting for the start lock on a
    # busy machine: it trains "forever" (FAKE_* is read when a worker is spawned) and is stopped below
    cfg = fake(monkeypatch, steps=2000, delay=0.05)
    barrier = threading.Barrier(8)
    ids: list[str] = []
    errors: list[BaseException] = []

    def press(i: int) -> None:
        try:
            barrier.wait()
            ids.append(orchs[i % 2].start(dataclasses.replace(cfg, run_name=f"press {i}")))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=press, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and len(ids) == 8
    assert sorted(statuses(orchs[0], ids)).count("queued") == 7
    [started] = [run_id for run_id in ids if orchs[0].get_run(run_id).status != "queued"]
    fake(monkeypatch, steps=3, delay=0.05)  # the queued ones, spawned later, are short
    orchs[0].stop(started)
    assert orchs[0].wait(started, timeout=90, interval=0.1).status is RunStatus.STOPPED
    for run_id in ids:
        assert orchs[0].wait(run_id, timeout=90, interval=0.1).status in (RunStatus.COMPLETED, RunStatus.STOPPED)
    assert [orchs[0].get_run(i).status for i in ids].count("completed") == 7
    assert_never_overlapping(orchs[0], ids)


def test_queue_survives_a_server_restart(make_orch, monkeypatch):
    first = make_orch()
    running = first.start(fake(monkeypatch, steps=30, delay=0.05))
    queued = first.start(fake(monkeypatch, steps=2))
    first.close()  # the server goes away; the worker keeps training and the queue is in the database
    second = make_orch()
    assert second.wait(running, timeout=60, interval=0.1).status is RunStatus.COMPLETED
    assert second.wait(queued, timeout=60, interval=0.1).status is RunStatus.COMPLETED
    assert_never_overlapping(second, [running, queued])


def test_queued_secret_stays_in_memory_and_a_restart_without_it_fails_clearly(make_orch, fake_worker, monkeypatch, home):
    first = make_orch()
    running = first.start(fake(monkeypatch, steps=1000, delay=0.05))
    token = "hf_queued_secret_123456"
    queued = first.start(dataclasses.replace(fake(monkeypatch, steps=1), hf_token=token))
    row = first.get_run(queued)
    assert row.needs_secrets == ("hf_token",) and token not in row.config_json
    assert token not in (paths.run_dir(queued) / "config.yaml").read_text()
    first.close()
    monkeypatch.delenv("HF_TOKEN", raising=False)
    second = make_orch()
    second.cancel(running)
    snap = second.wait(queued, timeout=60, interval=0.1)
    assert snap.status is RunStatus.FAILED
    assert "hf_token" in snap.error and "never written to disk" in snap.error
    assert token not in json.dumps(asdict(second.get_run(queued)))
    if second.store.is_sqlite:  # the database files themselves, write-ahead log included
        db_file = Path(second.store.url.removeprefix("sqlite:///"))
        assert db_file.is_file()
        for path in (db_file, db_file.with_name(db_file.name + "-wal")):
            assert not path.exists() or token.encode() not in path.read_bytes(), path


# Another process (the CLI) that looks at the queue once: it must leave a run whose secret it lacks alone.
OTHER_PROCESS = r"""
import sys
from db.store import Store
from trainer_core.jobs.orchestrator import Orchestrator
orch = Orchestrator(store=Store(sys.argv[1]), start_pump=False)
print("launched:", orch.launch_queued())
run = orch.get_run(sys.argv[2])
print("status:", run.status, "error:", run.error)
orch.close()
"""


def settle(orch: Orchestrator, run_id: str) -> RunStatus:
    """Pump by hand until the run has ended (for orchestrators made with start_pump=False)."""
    wait_until(lambda: orch.pump_once() or RunStatus(orch.get_run(run_id).status).is_terminal(), timeout=60,
               what=f"{run_id} to end")
    return RunStatus(orch.get_run(run_id).status)


def test_only_the_orchestrator_holding_a_queued_runs_secret_launches_it(home, store, fake_worker, monkeypatch):
    dashboard = Orchestrator(store=store, launcher=fake_worker, start_pump=False)
    try:
        busy = orphan_run(store, pid=os.getpid(), pid_started_at=psutil.Process().create_time())
        token = "hf_typed_into_the_dashboard_123"
        queued = dashboard.start(dataclasses.replace(fake(monkeypatch, steps=1), hf_token=token))
        assert dashboard.get_run(queued).status == RunStatus.QUEUED.value
        store.finish_run(busy, RunStatus.COMPLETED)  # the device is free: whoever looks first may launch
        result = run_python(OTHER_PROCESS, store.url, queued, env={"FINETUNE_STUDIO_HOME": str(home)})
        assert result.returncode == 0, result.stderr[-3000:]
        assert "launched: []" in result.stdout and "status: queued error: \n" in result.stdout, result.stdout
        assert dashboard.launch_queued() == [queued]
        assert settle(dashboard, queued) is RunStatus.COMPLETED
        assert "HF_TOKEN set: True" in dashboard.log_tail(queued)
    finally:
        dashboard.close()


def test_a_queued_run_whose_secret_holder_exited_fails_with_the_honest_reason(home, store, fake_worker, monkeypatch):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(gone.pid).create_time()
    gone.wait()
    run_id = "20260101-000000-5ec12e"
    paths.run_dir(run_id).mkdir(parents=True)
    (paths.run_dir(run_id) / "config.yaml").write_text(fake(monkeypatch, steps=1).to_yaml())
    store.create_run(RunRecord(id=run_id, name="queued elsewhere", status=RunStatus.QUEUED.value, devices="cpu",
                         queue_position=1.0, created_at=time.time(), needs_secrets="hf_token",
                         secrets_holder=f"{socket.gethostname()}:{gone.pid}:{started:.2f}:0a1b2c3d"))
    orch = Orchestrator(store=store, launcher=fake_worker, start_pump=False)
    try:
        assert orch.launch_queued() == []
        run = store.get_run(run_id)
        assert run.status == RunStatus.FAILED.value
        assert run.error == (
            "This run was queued with hf_token, which is never written to disk; the process that queued it and "
            f"held the secret in memory (pid {gone.pid} on {socket.gethostname()}) has exited before its turn "
            "came. Start it again and enter the secret, or set HF_TOKEN / WANDB_API_KEY in the environment of "
            "the dashboard or CLI.")
    finally:
        orch.close()


def test_a_resumed_run_shows_the_step_it_resumes_from_before_its_first_log_line(home, store, fake_worker, monkeypatch):
    orch = Orchestrator(store=store, launcher=fake_worker, start_pump=False)  # nothing is pumped: what start() itself shows
    try:
        parent = orphan_run(store, status=RunStatus.RUNNING.value)
        store.finish_run(parent, RunStatus.STOPPED)
        run_id = orch.start(fake(monkeypatch, steps=8), parent=store.get_run(parent), resumed_from_step=4)
        snap = orch.snapshot(run_id)
        assert (snap.step, snap.total_steps) == (4, 8)
        assert store.get_run(run_id).steps_done == 4
        orch.cancel(run_id)
        settle(orch, run_id)
    finally:
        orch.close()


def test_disjoint_gpu_sets_train_together_and_overlapping_ones_wait(orch, monkeypatch, fake_gpu_host):
    g0 = orch.start(dataclasses.replace(fake(monkeypatch, steps=200, delay=0.05), gpu_ids=[0]))
    g1 = orch.start(dataclasses.replace(fake(monkeypatch, steps=200, delay=0.05), gpu_ids=[1]))
    both = orch.start(dataclasses.replace(fake(monkeypatch, steps=1), gpu_ids=[0, 1]))
    every = orch.start(dataclasses.replace(fake(monkeypatch, steps=1), gpu_ids=[]))
    # g0 and g1 were launched at once: "starting", or already "running" on a busy machine, never "queued"
    assert [s != "queued" for s in statuses(orch, [g0, g1])] == [True, True]
    assert statuses(orch, [both, every]) == ["queued", "queued"]
    assert orch.get_run(both).devices == "gpu0,gpu1" and orch.get_run(every).devices == "gpu*"
    orch.cancel(g0)
    orch.wait(g0, timeout=30, interval=0.1)
    assert orch.launch_queued() == []  # asked directly rather than waiting for the pump: gpu1 is still busy
    assert orch.get_run(both).status == "queued"
    orch.cancel(g1)
    for run_id in (both, every):
        assert orch.wait(run_id, timeout=60, interval=0.1).status is RunStatus.COMPLETED
    assert_never_overlapping(orch, [both, every])


# ====================================================================== resume
def fake_checkpoint(run_id: str, step: int) -> Path:
    folder = paths.run_dir(run_id) / "checkpoints" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text('{"global_step": %d}' % step)
    return folder


@pytest.fixture
def data_file(home, tmp_path):
    path = tmp_path / "data" / "chat.jsonl"
    path.parent.mkdir()
    path.write_text("".join('{"messages": [{"role": "user", "content": "q%d"}, '
                            '{"role": "assistant", "content": "a%d"}]}\n' % (i, i) for i in range(20)))
    return path




def test_resume_starts_a_linked_run_from_the_latest_checkpoint_and_joins_the_charts(orch, monkeypatch, data_file):
    cfg = dataclasses.replace(fake(monkeypatch, steps=1000, delay=0.05, checkpoints=""), local_datasets=[str(data_file)])
    old = orch.start(cfg)
    wait_until(lambda: orch.snapshot(old).step >= 5, what="step 5")
    orch.stop(old)
    assert orch.wait(old, timeout=30, interval=0.1).status is RunStatus.STOPPED
    fake_checkpoint(old, 2)
    newest = fake_checkpoint(old, 4)
    (paths.run_dir(old) / "checkpoints" / "tmp-checkpoint-5").mkdir()  # a partial one is never used

    fake(monkeypatch, steps=8, checkpoints="")
    new = orch.resume(old)
    row = orch.get_run(new)
    assert (row.parent_run_id, row.resumed_from_step) == (old, 4)
    assert orch.run_config(new)["resume_from_checkpoint"] == str(newest)
    assert orch.run_config(new)["run_name"] == "fake train (resumed)"
    assert [e.message for e in orch.events(new) if e.kind == "resume"] == ["resumed from run 'fake train' at step 4"]
    orch.wait(new, timeout=30, interval=0.1)
    joined = orch.metrics(new, lineage=True)
    # The parent's steps up to the checkpoint, then the new run's own steps (the fake restarts at 1, so
    # steps 1-4 are the parent's and the child's rows overwrite nothing: they are separate runs).
    parent_part = joined.iloc[:4]
    assert list(parent_part["step"]) == [1, 2, 3, 4]
    assert list(orch.metrics(new)["step"]) == list(range(1, 9))
    live = orch.snapshot(new).metrics
    assert list(live["step"])[:4] == [1, 2, 3, 4]


@pytest.mark.parametrize("case", ["no checkpoint", "completed", "data changed", "unknown", "token missing"])
def test_resume_is_refused_with_a_reason(orch, monkeypatch, data_file, case):
    cfg = dataclasses.replace(fake(monkeypatch, steps=1000, delay=0.05, checkpoints=""), local_datasets=[str(data_file)])
    if case == "token missing":
        cfg = dataclasses.replace(cfg, hf_token="hf_secret_for_resume_1")
    if case == "completed":
        cfg = dataclasses.replace(fake(monkeypatch, steps=3, checkpoints=""), local_datasets=[str(data_file)])
    old = orch.start(cfg)
    wait_until(lambda: orch.snapshot(old).step >= 2, what="step 2")
    if case != "completed":
        orch.stop(old)
    assert orch.wait(old, timeout=30, interval=0.1).status is (
        RunStatus.COMPLETED if case == "completed" else RunStatus.STOPPED)
    if case != "no checkpoint":
        fake_checkpoint(old, 2)
    if case == "data changed":
        data_file.write_text(data_file.read_text() + '{"messages": [{"role": "user", "content": "new"}, '
                                                     '{"role": "assistant", "content": "row"}]}\n')
    monkeypatch.delenv("HF_TOKEN", raising=False)
    expected = {"no checkpoint": "no completed checkpoint", "completed": "nothing left to resume",
                "data changed": "training data of run 'fake train' changed", "unknown": "There is no run",
                "token missing": "hf_token, which is never stored"}[case]
    before = len(orch.list_runs())
    with pytest.raises(RunRefused, match=expected):
        orch.resume("nope" if case == "unknown" else old)
    assert len(orch.list_runs()) == before  # a refusal leaves nothing behind


def test_resume_checks_the_data_against_what_the_worker_loaded(orch, monkeypatch, data_file, tmp_path):
    """Issue 31 #15: the file was cut to 3 rows while the model loaded, so the worker trained on those 3; resuming on
    them is honest (it was refused), and resuming on the 20 rows checked at submit would mix data (it was accepted)."""
    gate = tmp_path / "go"
    cfg = dataclasses.replace(fake(monkeypatch, steps=1000, delay=0.05, checkpoints=""), local_datasets=[str(data_file)])
    monkeypatch.setenv("FAKE_PAUSE_AT", "1")
    monkeypatch.setenv("FAKE_PAUSE_UNTIL", str(gate))
    old = orch.start(cfg)
    submitted = data_file.read_text()
    assert orch.get_run(old).data_fingerprint == data_fp.data_fingerprint(cfg)
    wait_until(lambda: orch.snapshot(old).step >= 1, what="step 1")
    data_file.write_text("".join(submitted.splitlines(keepends=True)[:3]))
    loaded = data_fp.take(cfg)
    writer = ev.EventWriter(paths.run_dir(old) / "events.jsonl")  # what the worker reports (the fake is held)
    writer.emit(ev.DataEvent(fingerprint=loaded.digest, rows=loaded.rows))
    writer.close()
    gate.touch()
    wait_until(lambda: orch.get_run(old).data_fingerprint == loaded.digest, what="the loaded data's fingerprint")
    orch.stop(old)
    assert orch.wait(old, timeout=30, interval=0.1).status is RunStatus.STOPPED
    fake_checkpoint(old, 2)
    new = orch.resume(old)
    orch.cancel(new)
    orch.wait(new, timeout=30, interval=0.1)
    data_file.write_text(submitted)
    with pytest.raises(RunRefused, match="training data of run 'fake train' changed"):
        orch.resume(old)


def test_a_queued_run_takes_its_data_fingerprint_again_when_its_turn_comes(orch, monkeypatch, data_file):
    running = orch.start(fake(monkeypatch, steps=2000, delay=0.05))
    cfg = dataclasses.replace(fake(monkeypatch, steps=2, checkpoints=""), local_datasets=[str(data_file)])
    queued = orch.start(cfg)
    assert orch.get_run(queued).status == "queued"
    data_file.write_text(data_file.read_text() + '{"messages": [{"role": "user", "content": "late"}, '
                                                 '{"role": "assistant", "content": "row"}]}\n')
    orch.stop(running)
    assert orch.wait(queued, timeout=60, interval=0.1).status is RunStatus.COMPLETED
    now = data_fp.take(cfg)
    assert orch.get_run(queued).data_fingerprint == now.digest
    assert data_fp.read_checked(paths.run_dir(queued)) == now  # what the worker compares what it loads with


def test_resume_of_an_active_run_is_refused(orch, monkeypatch):
    run_id = orch.start(fake(monkeypatch, steps=1000, delay=0.05))
    with pytest.raises(RunRefused, match="still"):
        orch.resume(run_id)
    orch.cancel(run_id)
    orch.wait(run_id, timeout=30, interval=0.1)


def test_old_database_gains_the_new_columns_without_losing_rows(tmp_path):
    import sqlite3

    from db.store import Store

    db = tmp_path / "old.db"
    con = sqlite3.connect(db)
    con.execute("create table run (id varchar(64) primary key, name varchar not null, status varchar not null)")
    con.execute("insert into run values ('r1', 'an old run', 'completed')")
    con.commit()
    con.close()
    store = Store(f"sqlite:///{db}")
    run = store.get_run("r1")
    assert (run.name, run.status, run.queue_position, run.devices, run.parent_run_id) == (
        "an old run", "completed", None, "", None)
    store.create_run(RunRecord(id="r2", name="new", status="queued", devices="cpu", queue_position=1.0))
    assert [r.id for r in store.queued_runs()] == ["r2"]
