"""The database is a cache of the run folders: `db rebuild` restores a deleted one row by row, and a corrupt
or deleted database is a message with the way out (CLI and pages), never a traceback. Rebuild keeps every job it
can (a journal that lost its first line comes back from job.json, an eval that never reported keeps its row, a serve
job's "serving at" line survives), reads a moved data root's paths under their new place without trusting a forged
one, is for admins only, and finishes with copied or renamed folders and a damaged journal."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from sqlmodel import Session, SQLModel, select
from streamlit.testing.v1 import AppTest

from db import users
from db.entities import RunRecord
from db.models import Metric, Run, RunEvent
from db.store import Store
from tests.support import ROOT, fake, wait_for_step
from tests.support.apptest import APP
from tests.support.factories import run_folder
from trainer_core import __main__ as cli
from trainer_core.auth.access import Actor, Role
from trainer_core.config import BUNDLED_MODEL
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.export.spec import ExportSpec
from trainer_core.jobs import evals, rebuild
from trainer_core.protocol import events as ev
from trainer_core.protocol import journal, paths
from trainer_core.protocol.status import JobKind, RunStatus, write_kind
from trainer_core.serving.spec import ServeSpec, hash_key
from trainer_core.specs import jobspec
from trainer_core.specs.model_source import ModelSource


def dump(store: Store) -> dict:
    """Every row of the three tables, in a stable order (timeline ids are autoincrement, so left out)."""
    with Session(store.engine) as session:
        runs = sorted((r.model_dump() for r in session.exec(select(Run))), key=lambda r: r["id"])
        metrics = sorted(((m.run_id, m.step), m.model_dump()) for m in session.exec(select(Metric)))
        events = sorted((e.run_id, e.ts, e.kind, e.message) for e in session.exec(select(RunEvent)))
    return {"runs": runs, "metrics": [m for _, m in metrics], "events": events}


def wipe(store: Store) -> None:
    """Lose the database: delete the SQLite files, or drop every table on PostgreSQL."""
    if store.is_sqlite:
        store.engine.dispose()
        db_file = Path(store.url[len("sqlite:///"):])
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db_file}{suffix}").unlink(missing_ok=True)
    else:
        SQLModel.metadata.drop_all(store.engine)
        store.engine.dispose()


def record_runs(orch, store, monkeypatch) -> dict[str, str]:
    """One run of each outcome through real (fake-worker) runs: completed with a NaN alert and an eval,
    stopped on request, failed, removed from the queue, and one deleted from History with its folder kept."""
    ids = {}
    ids["completed"] = orch.start(fake(monkeypatch, steps=6, nan_step="3", evals="4:0.75", checkpoints="4"))
    orch.wait(ids["completed"], timeout=60, interval=0.05)
    ids["failed"] = orch.start(fake(monkeypatch, mode="exit3"))
    orch.wait(ids["failed"], timeout=60, interval=0.05)
    ids["stopped"] = orch.start(fake(monkeypatch, steps=2000, delay=0.02))
    wait_for_step(orch, ids["stopped"], 3)
    ids["removed"] = orch.start(fake(monkeypatch, steps=2))  # queued behind the running one
    assert orch.get_run(ids["removed"]).status == RunStatus.QUEUED.value
    orch.remove_from_queue(ids["removed"])
    orch.stop(ids["stopped"])
    orch.wait(ids["stopped"], timeout=60, interval=0.05)
    deleted = orch.start(fake(monkeypatch, steps=2))
    orch.wait(deleted, timeout=60, interval=0.05)
    orch.delete_run(deleted, delete_files=False)
    ids["deleted"] = deleted
    orch.close()
    expected = {"completed": "completed", "failed": "failed", "stopped": "stopped", "removed": "cancelled"}
    for name, status in expected.items():
        assert store.get_run(ids[name]).status == status, (name, store.get_run(ids[name]).error)
    return ids


def test_rebuild_restores_a_deleted_database_row_by_row(make_orch, store, monkeypatch):
    ids = record_runs(make_orch(), store, monkeypatch)
    before = dump(store)
    assert [e for e in before["events"] if e[2] == "alert"], "the NaN loss should have raised an alert"
    assert {r["id"] for r in before["runs"]} == {ids[k] for k in ("completed", "failed", "stopped", "removed")}
    wipe(store)

    report = rebuild.rebuild(store.url)

    after = dump(Store(store.url))
    assert after["runs"] == before["runs"]
    assert after["metrics"] == before["metrics"]
    assert after["events"] == before["events"]
    assert sorted(report.runs) == sorted(ids[k] for k in ("completed", "failed", "stopped", "removed"))
    assert report.active == [] and report.skipped == []
    assert paths.run_dir(ids["deleted"]).is_dir()  # kept on disk, and still not back in History


def test_rebuild_keeps_the_old_database_file_aside(home, store):
    if not store.is_sqlite:
        pytest.skip("PostgreSQL databases are not files")
    db_file = Path(store.url[len("sqlite:///"):])
    store.engine.dispose()
    original = db_file.read_bytes()
    report = rebuild.rebuild(store.url)
    assert len(report.moved_aside) >= 1
    kept = Path(report.moved_aside[0])
    assert kept.name.startswith(db_file.name + ".moved-aside-") and kept.read_bytes() == original
    assert db_file.exists()  # a fresh, healthy database took its place


def test_rebuild_refuses_while_a_dashboard_or_cli_is_running(make_orch, store, monkeypatch):
    orch = make_orch()  # pumping, even with nothing to follow: it may write to the database at any moment
    run_id = orch.start(fake(monkeypatch, steps=2))
    orch.wait(run_id, timeout=60, interval=0.05)
    with pytest.raises(rebuild.RebuildRefused, match="A dashboard or CLI is running on this data folder"):
        rebuild.rebuild(store.url)
    assert store.get_run(run_id).status == RunStatus.COMPLETED.value  # nothing was moved or changed
    if store.is_sqlite:
        assert not list(Path(store.url[len("sqlite:///"):]).parent.glob("*.moved-aside-*"))
    orch.close()
    assert rebuild.rebuild(store.url if store.is_sqlite else _empty(store)).runs == [run_id]


def test_rebuild_refuses_while_another_process_follows_a_run(make_orch, store, monkeypatch):
    orch = make_orch()
    run_id = orch.start(fake(monkeypatch, steps=2000, delay=0.02))
    wait_for_step(orch, run_id, 1)
    orch._presence.close()  # as if the presence lock were gone: the run's pump lock still protects it
    with pytest.raises(rebuild.RebuildRefused, match=run_id):
        rebuild.rebuild(store.url)
    assert store.get_run(run_id) is not None  # nothing was moved or changed
    orch.cancel(run_id)
    orch.wait(run_id, timeout=60, interval=0.05)


def _empty(store: Store) -> str:
    """A PostgreSQL database emptied for the rebuild (on SQLite the file is moved aside instead)."""
    wipe(store)
    return store.url


def test_a_run_still_training_is_rebuilt_active_and_adopted_again(make_orch, store, monkeypatch):
    first = make_orch()
    run_id = first.start(fake(monkeypatch, steps=2000, delay=0.05))  # ~100 s: it outlives the rebuild
    wait_for_step(first, run_id, 3)
    first.close()  # the server goes away; the worker keeps training
    wipe(store)

    report = rebuild.rebuild(store.url)
    assert report.active == [run_id]
    rebuilt = Store(store.url).get_run(run_id)
    assert rebuilt.status == RunStatus.RUNNING.value and rebuilt.steps_done >= 3

    second = make_orch()  # the next server adopts it from the rebuilt log offset
    wait_for_step(second, run_id, rebuilt.steps_done + 2)
    second.cancel(run_id)
    snap = second.wait(run_id, timeout=60, interval=0.05)
    assert snap.status is RunStatus.CANCELLED
    assert second.metrics(run_id)["step"].tolist() == list(range(1, second.get_run(run_id).steps_done + 1))


def test_a_folder_without_a_journal_is_rebuilt_from_config_and_events(make_orch, store, monkeypatch):
    orch = make_orch()
    run_id = orch.start(fake(monkeypatch, steps=4, nan_step="0", evals="", checkpoints=""))
    orch.wait(run_id, timeout=60, interval=0.05)
    orch.close()
    before = store.get_run(run_id)
    (paths.run_dir(run_id) / journal.JOURNAL_FILE).unlink()  # as written by a version before the journal
    wipe(store)

    rebuild.rebuild(store.url)
    after = Store(store.url).get_run(run_id)
    assert after.status == "completed" and after.steps_done == 4
    assert after.final_loss == before.final_loss and after.model == before.model and after.name == before.name
    assert Store(store.url).metrics_frame(run_id)["loss"].tolist() == [2.0, 1.0, 2.0 / 3, 0.5]


def test_the_postgres_rebuild_refuses_a_database_that_holds_runs(make_orch, store, monkeypatch):
    if store.is_sqlite:
        pytest.skip("SQLite files are moved aside instead")
    orch = make_orch()
    run_id = orch.start(fake(monkeypatch, steps=2))
    orch.wait(run_id, timeout=60, interval=0.05)
    orch.close()
    with pytest.raises(rebuild.RebuildRefused, match="empty PostgreSQL database"):
        rebuild.rebuild(store.url)


# ====================================================================== broken databases: CLI
def settle_folder(run_dir: Path) -> None:
    """Date a run folder's config a minute back: older than a start in progress (rebuild.CREATING_S)."""
    config = run_dir / "config.yaml"
    past = config.stat().st_mtime - 60
    os.utime(config, (past, past))

def corrupt_database(home: Path) -> Path:
    db_file = home / "studio.db"
    home.mkdir(parents=True, exist_ok=True)
    db_file.write_bytes(b"this is not a database " * 200)
    return db_file


@pytest.mark.parametrize("argv", [["runs"], ["runs", "show", "x"], ["runs", "export", "x"]])
def test_cli_on_a_corrupt_database_says_what_happened_and_how_to_rebuild(home, capsys, argv):
    corrupt_database(home)
    assert cli.main(argv) == 4
    err = capsys.readouterr().err
    assert "cannot be used" in err and "file is not a database" in err
    assert "python -m trainer_core db rebuild" in err and "Traceback" not in err


def test_cli_on_an_unreachable_postgres_server_says_to_check_it_not_only_to_rebuild(home, capsys, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://studio:hunter2@127.0.0.1:9/nowhere")
    assert cli.main(["runs"]) == 4
    err = capsys.readouterr().err
    assert "studio:***@127.0.0.1:9/nowhere" in err and "hunter2" not in err
    assert "Check that the database server is running and DATABASE_URL is right" in err and "Traceback" not in err


def test_cli_db_rebuild_moves_a_corrupt_file_aside_and_restores_the_runs(make_orch, store, monkeypatch, capsys, home):
    if not store.is_sqlite:
        pytest.skip("the CLI rebuilds the configured database; this test corrupts a SQLite file")
    monkeypatch.setenv("DATABASE_URL", store.url)
    orch = make_orch()
    run_id = orch.start(fake(monkeypatch, steps=3))
    orch.wait(run_id, timeout=60, interval=0.05)
    orch.close()
    store.engine.dispose()
    db_file = Path(store.url[len("sqlite:///"):])
    for suffix in ("-wal", "-shm"):
        Path(f"{db_file}{suffix}").unlink(missing_ok=True)
    db_file.write_bytes(b"garbage " * 1000)

    assert cli.main(["db", "rebuild"]) == 0
    out = capsys.readouterr().out
    assert "Rebuilt 1 run(s)" in out and ".moved-aside-" in out
    assert list(db_file.parent.glob(db_file.name + ".moved-aside-*"))[0].read_bytes() == b"garbage " * 1000
    assert cli.main(["runs", "show", run_id]) == 0
    assert "Completed" in capsys.readouterr().out


def test_cli_notices_run_folders_the_database_does_not_know(make_orch, store, monkeypatch, capsys):
    if not store.is_sqlite:
        pytest.skip("a deleted SQLite file is the case that is silently recreated empty")
    monkeypatch.setenv("DATABASE_URL", store.url)
    orch = make_orch()
    run_id = orch.start(fake(monkeypatch, steps=2))
    orch.wait(run_id, timeout=60, interval=0.05)
    orch.close()
    wipe(store)
    assert cli.main(["runs"]) == 0
    assert "not in the database" not in capsys.readouterr().err  # seconds old: it may be a start in progress
    settle_folder(paths.run_dir(run_id))
    assert cli.main(["runs"]) == 0
    err = capsys.readouterr().err
    assert f"1 run folder(s) are not in the database ({run_id})" in err and "db rebuild" in err


# ====================================================================== broken databases: pages
def test_pages_on_a_corrupt_database_show_the_problem_and_the_rebuild_button(app_home):
    db_file = corrupt_database(app_home)
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception, at.exception
    assert any("cannot be used" in e.value and "file is not a database" in e.value for e in at.error)
    button = next(b for b in at.button if b.label == "Rebuild the database from the run folders")
    button.click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert any("Rebuilt 0 run(s)" in s.value for s in at.success)
    kept = list(app_home.glob("studio.db.moved-aside-*"))
    assert len(kept) == 1 and kept[0].read_bytes().startswith(b"this is not a database")
    assert db_file.exists()
    at.switch_page("pages/history.py").run()  # every page works again
    assert not at.exception, at.exception


def test_pages_notice_a_deleted_database_and_offer_the_rebuild(app_home):
    # a finished run's folder, as a deleted studio.db leaves it (SQLite recreates the file empty)
    run_dir = paths.run_dir("20260101-120000-abcdef")
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("run_name: before the accident\nmax_steps: 2\n")
    (run_dir / "events.jsonl").write_text("\n".join(json.dumps(line) for line in [
        {"kind": "status", "status": "running", "phase": "training", "ts": 1767268801.0},
        {"kind": "progress", "step": 1, "total_steps": 2, "loss": 1.5, "ts": 1767268802.0},
        {"kind": "progress", "step": 2, "total_steps": 2, "loss": 1.25, "ts": 1767268803.0},
        {"kind": "complete", "status": "completed", "steps": 2, "final_loss": 1.25, "ts": 1767268804.0},
    ]) + "\n")
    settle_folder(run_dir)
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception, at.exception
    assert any("1 run folder(s) are not in the database" in w.value for w in at.warning)
    at.switch_page("pages/settings.py").run()
    next(b for b in at.button if b.label == "Rebuild the database from the run folders").click().run()
    assert not at.exception, at.exception
    assert any("Rebuilt 1 run(s)" in s.value for s in at.success)
    assert not any("not in the database" in w.value for w in at.warning)
    run = Store().get_run(run_dir.name)
    assert (run.name, run.status, run.steps_done, run.final_loss) == ("before the accident", "completed", 2, 1.25)


def test_rebuild_carries_users_roles_and_api_tokens_over(home, store):
    """Users, roles and token hashes are kept nowhere but the database: the rebuild copies them across."""
    if not store.is_sqlite:
        pytest.skip("a PostgreSQL rebuild fills an empty database and leaves the old one, users and all, in place")
    users.ensure_user(store, "ann", Role.VIEWER)
    users.set_role(store, "ann", Role.OPERATOR)  # an admin's decision, recorded only here
    token = users.create_token(store, "ann", label="laptop")
    store.engine.dispose()
    report = rebuild.rebuild(store.url)
    assert report.accounts == (1, 1)
    assert "Carried over 1 user(s) and 1 API token(s)" in report.summary()
    fresh = Store(store.url)
    try:
        assert users.get_user(fresh, "ann").role == Role.OPERATOR.value
        assert users.user_for_token(fresh, token) == Actor("ann", Role.OPERATOR)
    finally:
        fresh.engine.dispose()


def test_rebuild_of_a_corrupt_file_says_users_and_tokens_are_lost(home):
    db_file = paths.data_root() / "studio.db"
    db_file.parent.mkdir(parents=True, exist_ok=True)
    db_file.write_bytes(b"not a database at all")
    report = rebuild.rebuild()
    assert report.accounts is None
    assert "Users, roles and API tokens could not be read from it" in report.summary()


SOURCE_RUN = "20260101-000000-srcsrc"


def export_job(store: Store, job_id: str = "20260102-100003-cccccc") -> Path:
    """A finished export job as its worker and the pump leave it: job.json, a journal, an artifact on disk and
    the events naming it by absolute path."""
    run_folder(SOURCE_RUN)
    job = paths.run_dir(job_id)
    job.mkdir(parents=True)
    jobspec.write_spec(job, ExportSpec(source=ModelSource(run_id=SOURCE_RUN), targets=["adapter"], verify=False))
    write_kind(job, JobKind.EXPORT)
    store.create_run(RunRecord(id=job.name, name="export", status=RunStatus.STARTING, kind=JobKind.EXPORT,
                               created_at=time.time() - 60, output_dir=str(job)))
    (job / "artifacts").mkdir()
    (job / "artifacts" / "m-adapter.zip").write_bytes(b"PK")
    writer = ev.EventWriter(job / ev.LOG_NAME)
    writer.emit(ev.StatusEvent(status=RunStatus.RUNNING.value, phase="publish"))
    writer.emit(ev.ArtifactEvent(artifact="adapter", path=str(job / "artifacts" / "m-adapter.zip"), size=2,
                                 sha256="c" * 64, source_run_id=SOURCE_RUN, detail="adapter"))
    writer.emit(ev.CompleteEvent(status=RunStatus.COMPLETED.value, output_dir=str(job / "artifacts")))
    writer.close()
    store.finish_run(job.name, RunStatus.COMPLETED, output_dir=str(job / "artifacts"))
    return job


def warnings_of(store: Store, run_id: str) -> list[str]:
    return [e.message for e in store.get_events(run_id) if e.kind == "warning"]


# ====================================================================== rebuild after the data root moved
def test_rebuild_after_the_data_root_moved_reads_every_recorded_path_under_the_new_root(make_orch, store, home,
                                                                                       tmp_path, monkeypatch):
    """The report said "now read under <new root>", but the run kept its old output folder (the journal's finish
    record), its checkpoint and the export's artifact were refused as "outside the job's folder" and the export
    lost its download rows."""
    orch = make_orch()
    run_id = orch.start(fake(monkeypatch, steps=4, checkpoints="2"))
    orch.wait(run_id, timeout=60, interval=0.05)
    orch.close()
    job = export_job(store)
    store.engine.dispose()
    moved = tmp_path / "moved"
    shutil.move(str(home), str(moved))
    monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(moved))
    shutil.copytree(moved / "runs" / run_id, moved / "runs" / f"{run_id}-copy", symlinks=True)
    wipe(store)

    report = rebuild.rebuild(store.url)
    assert report.skipped == []
    assert sorted(report.rebased) == sorted([run_id, f"{run_id}-copy", job.name])
    fresh = Store(store.url)
    for rid in (run_id, f"{run_id}-copy"):  # each folder's paths are its own, under the new root
        folder = moved / "runs" / rid
        assert fresh.get_run(rid).output_dir == str(folder / "adapter")
        assert warnings_of(fresh, rid) == []
        assert [e.message for e in fresh.get_events(rid) if e.kind == "checkpoint"] == [
            f"checkpoint saved at step 2: {folder / 'checkpoints' / 'checkpoint-2'}"]
    new_job = moved / "runs" / job.name
    assert fresh.get_run(job.name).output_dir == str(new_job / "artifacts")
    assert [a.path for a in fresh.artifacts(job_id=job.name)] == [str(new_job / "artifacts" / "m-adapter.zip")]
    assert warnings_of(fresh, job.name) == []
    fresh.engine.dispose()


def test_a_moved_folder_still_refuses_a_forged_path(home, store, tmp_path, monkeypatch):
    """Reading old paths under the new place never lets a path out of the folder (.. after the old prefix)."""
    job = export_job(store)
    with open(job / ev.LOG_NAME, "a") as fh:
        fh.write(ev.encode(ev.ArtifactEvent(artifact="card", path=str(job / ".." / ".." / ".." / "etc" / "passwd"),
                                            size=4, sha256="d" * 64, ts=5.0)) + "\n")
    store.engine.dispose()
    moved = tmp_path / "moved"
    shutil.move(str(home), str(moved))
    monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(moved))
    wipe(store)
    rebuild.rebuild(store.url)
    fresh = Store(store.url)
    assert [Path(a.path).name for a in fresh.artifacts(job_id=job.name)] == ["m-adapter.zip"]
    assert [w.split(":")[0] for w in warnings_of(fresh, job.name)] == ["artifact event ignored"]
    fresh.engine.dispose()


# ====================================================================== rebuild keeps every job it can
@pytest.mark.parametrize("damage", ["journal deleted", "first line cut"])
def test_a_job_whose_journal_lost_its_create_line_comes_back_from_job_json(home, store, damage):
    """rebuild.py read only config.yaml for such a folder: an eval/export/serve job was skipped although its
    events.jsonl and job.json were intact."""
    job = export_job(store)
    journal_file = job / journal.JOURNAL_FILE
    if damage == "journal deleted":
        journal_file.unlink()
    else:
        lines = journal_file.read_bytes().splitlines(keepends=True)
        journal_file.write_bytes(lines[0][: len(lines[0]) // 2] + b"\n" + b"".join(lines[1:]))
    wipe(store)
    report = rebuild.rebuild(store.url)
    assert job.name in report.runs and report.skipped == []
    fresh = Store(store.url)
    row = fresh.get_run(job.name)
    assert (row.kind, row.status) == (JobKind.EXPORT, RunStatus.COMPLETED)
    assert [a.kind for a in fresh.artifacts(job_id=job.name)] == ["adapter"]
    fresh.engine.dispose()


def test_a_serve_jobs_serving_at_line_survives_a_rebuild_after_its_stop(home, store):
    """The replay started from the journal's last status (stopping), whose handler drops serve_ready: the
    "serving at URL" timeline line was lost."""
    job = paths.run_dir("20260102-100004-dddddd")
    job.mkdir(parents=True)
    jobspec.write_spec(job, ServeSpec(sources=[ModelSource(model=BUNDLED_MODEL)], api_key_hash=hash_key("k")))
    write_kind(job, JobKind.SERVE)
    store.create_run(RunRecord(id=job.name, name="serve", status=RunStatus.STARTING, kind=JobKind.SERVE,
                               created_at=time.time() - 60, output_dir=str(job)))
    writer = ev.EventWriter(job / ev.LOG_NAME)
    writer.emit(ev.StatusEvent(status=RunStatus.RUNNING.value, phase="loading"))
    writer.emit(ev.ServeReadyEvent(url="http://127.0.0.1:8931/v1", models={"m": "base"}))
    writer.emit(ev.CompleteEvent(status=RunStatus.STOPPED.value))
    writer.close()
    store.update_run(job.name, status=RunStatus.STOPPING.value)  # the Stop request, journaled
    store.finish_run(job.name, RunStatus.STOPPED)
    wipe(store)
    rebuild.rebuild(store.url)
    fresh = Store(store.url)
    assert "serving m at http://127.0.0.1:8931/v1" in [e.message for e in fresh.get_events(job.name)]
    assert fresh.get_run(job.name).status == RunStatus.STOPPED
    fresh.engine.dispose()


def test_an_eval_that_never_reported_keeps_its_row_and_its_baseline_is_found_after_rebuild(make_orch, store, home,
                                                                                         tmp_path, monkeypatch):
    """Result rows are created at submission and are not in the journal: after a rebuild a queued baseline was
    not found, and the next eval of the same data queued a second one."""
    orch = make_orch()
    trained = orch.start(dataclasses.replace(fake(monkeypatch, steps=2), run_name="trained"))
    orch.wait(trained, timeout=60, interval=0.05)
    (paths.run_dir(trained) / "adapter").mkdir()
    (paths.run_dir(trained) / "adapter" / "adapter_config.json").write_text("{}")
    pause = home.parent / "go"  # outside the data root, which a sandboxed worker does not see
    monkeypatch.setenv("FAKE_PAUSE_AT", "1")  # a run holds the device: the eval and its baseline wait
    monkeypatch.setenv("FAKE_PAUSE_UNTIL", str(pause))
    blocker = orch.start(fake(monkeypatch, steps=3))
    data = tmp_path / "test.jsonl"
    data.write_bytes((ROOT / "tests" / "fixtures" / "datasets" / "alpaca.jsonl").read_bytes())
    spec = EvalSpec(source=ModelSource(run_id=trained), data=str(data), max_new_tokens=8)
    try:
        started = evals.submit(orch, spec, None)
        assert started.baseline_new and orch.get_run(started.baseline_id).status is RunStatus.QUEUED
        orch.close()
        wipe(store)
        rebuild.rebuild(store.url)
        fresh = Store(store.url)
        for job_id in (started.job_id, started.baseline_id):
            assert fresh.eval_result(job_id) is not None, job_id
        found = fresh.find_eval(f"base:{BUNDLED_MODEL}", fresh.eval_result(started.job_id).data_fingerprint,
                                fresh.eval_result(started.job_id).settings_hash)
        assert found.job_id == started.baseline_id and evals.reusable(found)
        again = evals.submit(make_orch(), spec, None)  # the next server: the same baseline, not a new one
        assert (again.baseline_id, again.baseline_new) == (started.baseline_id, False)
        fresh.engine.dispose()
    finally:
        pause.write_text("")
    latest = make_orch()
    for job_id in (blocker, started.job_id, started.baseline_id, again.job_id):
        latest.wait(job_id, timeout=60, interval=0.05)


# ====================================================================== the journal is a run folder's file
def test_a_forged_output_dir_in_the_journal_is_not_stored_by_rebuild(home, store):
    """The pump checks output_dir from the event log; rebuild restored the journal's own copy unchecked."""
    job = export_job(store)
    with open(job / journal.JOURNAL_FILE, "a") as fh:
        fh.write(json.dumps({"op": "update", "values": {"output_dir": "/etc"}}) + "\n")
    lines = (job / journal.JOURNAL_FILE).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    for record in records:
        if record["op"] == "finish":
            record["values"]["output_dir"] = "../../../../etc"
    (job / journal.JOURNAL_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    wipe(store)
    rebuild.rebuild(store.url)
    fresh = Store(store.url)
    assert fresh.get_run(job.name).output_dir == str(job)  # what its submission recorded; never /etc
    assert fresh.get_run(job.name).status == RunStatus.COMPLETED
    fresh.engine.dispose()


# ====================================================================== db rebuild: admins only
def _moved_aside() -> list[Path]:
    return sorted(paths.data_root().glob("studio.db.moved-aside-*"))


@pytest.mark.parametrize("who, expected", [
    ("viewer", "refused: only admins can rebuild the database; the token in FINETUNE_STUDIO_TOKEN is ann's (role "
               "viewer)"),
    ("operator", "refused: only admins can rebuild the database; the token in FINETUNE_STUDIO_TOKEN is ann's (role "
                 "operator)"),
    ("garbage", "refused: this is not a Finetune Studio API token (they start with fts_) (FINETUNE_STUDIO_TOKEN)"),
    ("revoked", "refused: the API token is unknown or was revoked; create a new one on the Account page "
                "(FINETUNE_STUDIO_TOKEN)"),
])
def test_cli_db_rebuild_is_refused_to_anyone_but_an_admin(home, monkeypatch, capsys, who, expected):
    """A viewer's FINETUNE_STUDIO_TOKEN, or a garbage one, rebuilt the database with exit 0."""
    from db import users
    from db.store import Store
    from trainer_core import __main__ as cli
    from trainer_core.auth.access import Role

    store = Store()
    users.ensure_user(store, "ann", Role.OPERATOR if who == "operator" else Role.VIEWER)
    token = users.create_token(store, "ann", label="laptop")
    store.engine.dispose()
    tokens = {"viewer": token, "operator": token, "garbage": "not-a-token", "revoked": token[:-4] + "xxxx"}
    monkeypatch.setenv("FINETUNE_STUDIO_TOKEN", tokens[who])
    assert cli.main(["db", "rebuild"]) == 2
    assert capsys.readouterr().err.strip() == expected
    assert _moved_aside() == []  # nothing was touched


def test_cli_db_rebuild_runs_for_an_admin_token_and_for_the_local_user(home, monkeypatch, capsys):
    from db import users
    from db.store import Store
    from trainer_core import __main__ as cli
    from trainer_core.auth.access import Role

    store = Store()
    users.ensure_user(store, "root", Role.ADMIN)
    token = users.create_token(store, "root", label="ops")
    store.engine.dispose()
    monkeypatch.setenv("FINETUNE_STUDIO_TOKEN", token)
    assert cli.main(["db", "rebuild"]) == 0
    monkeypatch.delenv("FINETUNE_STUDIO_TOKEN")
    assert cli.main(["db", "rebuild"]) == 0
    assert "Rebuilt 0 run(s)" in capsys.readouterr().out and len(_moved_aside()) >= 1


def test_the_dashboards_rebuild_refuses_a_shared_mode_user_who_is_not_an_admin(app_home, monkeypatch):
    """Only a disabled button guarded it: the function behind it rebuilt for anyone."""
    from trainer_core.auth.access import Actor, Role
    from trainer_core.jobs import rebuild
    from ui import auth, state

    monkeypatch.setattr(auth, "shared_mode", lambda: True)
    monkeypatch.setattr(auth, "current_actor", lambda: Actor("ann", Role.OPERATOR))
    with pytest.raises(rebuild.RebuildRefused, match="Only an admin can rebuild the database; ann's role is operator"):
        state.rebuild_database()
    assert _moved_aside() == []
    monkeypatch.setattr(auth, "current_actor", lambda: Actor("root", Role.ADMIN))
    assert state.rebuild_database().runs == []


# ====================================================================== db rebuild finishes
def test_rebuild_finishes_with_a_copied_and_a_renamed_folder_and_a_damaged_journal(make_orch, store, monkeypatch):
    """cp -a runs/A runs/A-copy gave IntegrityError (exit 4) with half the runs; a renamed folder an AttributeError;
    one invalid UTF-8 byte in a journal skipped the whole run."""
    import shutil

    from tests.jobs.test_rebuild import wipe
    from trainer_core.jobs import rebuild

    orch = make_orch()
    first = orch.start(fake(monkeypatch, steps=2))
    orch.wait(first, timeout=60, interval=0.05)
    second = orch.start(fake(monkeypatch, steps=2))
    orch.wait(second, timeout=60, interval=0.05)
    orch.close()
    shutil.copytree(paths.run_dir(first), paths.run_dir(first + "-copy"), symlinks=True)
    with open(paths.run_dir(second) / "journal.jsonl", "ab") as fh:
        fh.write(b'{"op": "event", "kind": "warning", "message": "caf\xe9", "ts": 5.0}\n')
    wipe(store)
    report = rebuild.rebuild(store.url)
    assert report.skipped == []
    assert sorted(report.runs) == sorted([first, first + "-copy", second])
    assert report.renamed == [f"{first}-copy: its journal names run {first}"]
    fresh = type(store)(store.url)
    assert fresh.get_run(second).status == "completed" and fresh.get_run(first + "-copy").status == "completed"
    fresh.engine.dispose()
