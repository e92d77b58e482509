"""The database is a cache of the run folders: `db rebuild` restores a deleted one row by row, and a corrupt
or deleted database is a message with the way out (CLI and pages), never a traceback."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sqlmodel import Session, SQLModel, select
from streamlit.testing.v1 import AppTest

from db import users
from db.models import Metric, Run, RunEvent
from db.store import Store
from tests.support import fake, wait_for_step
from tests.support.apptest import APP
from trainer_core import __main__ as cli
from trainer_core.auth.access import Actor, Role
from trainer_core.jobs import rebuild
from trainer_core.protocol import journal, paths
from trainer_core.protocol.status import RunStatus



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
