"""Issue 24 hardening of the job machinery: a bad job.json fails alone and the queue moves on; paths from a run
folder stay inside it; forged event values are refused where they enter; `db rebuild` is for admins, finishes,
and keeps every job it can."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support import fake, wait_until
from tests.support.factories import run_folder
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus


# ====================================================================== the queue and job.json
@pytest.mark.parametrize("edit", [{"targets": [["adapter"]]}, {"quantizations": [["q8_0"]]}, {"source": []}])
def test_a_queued_job_whose_job_json_was_spoiled_fails_alone_and_the_queue_moves_on(orch, home, monkeypatch, edit):
    """It passed validate() at submit; edited while queued, its turn raised TypeError on every pump tick and
    every job behind it stayed queued forever."""
    from trainer_core.export.spec import ExportSpec

    run_folder("20260101-000000-srcsrc")
    pause = home.parent / "go"  # outside the data root, which a sandboxed worker does not see
    cfg = fake(monkeypatch, steps=3)
    monkeypatch.setenv("FAKE_PAUSE_AT", "1")  # the first run holds the device until the test says so
    monkeypatch.setenv("FAKE_PAUSE_UNTIL", str(pause))
    first = orch.start(cfg)
    export = orch.submit(ExportSpec(source=ModelSource(run_id="20260101-000000-srcsrc"), targets=["adapter"],
                                    verify=False))
    behind = orch.start(cfg)
    assert [orch.get_run(i).status for i in (export, behind)] == [RunStatus.QUEUED, RunStatus.QUEUED]
    spec_file = paths.run_dir(export) / "job.json"
    spec_file.write_text(json.dumps({**json.loads(spec_file.read_text()), **edit}))

    monkeypatch.delenv("FAKE_PAUSE_AT")
    pause.write_text("")
    orch.wait(first, timeout=30, interval=0.05)
    wait_until(lambda: orch.get_run(export).status is RunStatus.FAILED, what="the spoiled job failed")
    field = next(iter(edit))
    assert orch.get_run(export).error.startswith(f"its job.json cannot be read: {field}: ")
    done = orch.wait(behind, timeout=30, interval=0.05)
    assert done.status is RunStatus.COMPLETED


# ====================================================================== paths from a run folder
def test_inside_run_resolves_every_path_and_symlink_inside_the_run_folder_or_its_export_target(home, tmp_path):
    job = paths.run_dir("20260101-000000-jobjob")
    (job / "artifacts").mkdir(parents=True)
    (job / "artifacts" / "a.zip").write_bytes(b"PK")
    (job / "artifacts" / "link").symlink_to("/etc/passwd")
    target = tmp_path / "mine"
    target.mkdir()
    assert paths.inside_run(job, str(job / "artifacts" / "a.zip")) == job / "artifacts" / "a.zip"
    assert paths.inside_run(job, "artifacts/a.zip") == job / "artifacts" / "a.zip"  # relative: from the folder
    assert paths.inside_run(job, str(target / "m.gguf"), [target]) == target / "m.gguf"
    for forged in ["/etc/passwd", "../../../../etc/hosts", str(job / "artifacts" / "link"), str(target / "m.gguf")]:
        with pytest.raises(paths.UnsafePathError, match="outside the job's folder"):
            paths.inside_run(job, forged)
    for wide in [Path("/"), paths.data_root(), paths.runs_dir()]:  # a root holding the run folder widens nothing
        with pytest.raises(paths.UnsafePathError):
            paths.inside_run(job, "/etc/passwd", [wide])
    with pytest.raises(paths.BadPathError):
        paths.inside_run(job, "a\x00b")


def _export_job(store, job_id: str = "20260102-100002-bbbbbb") -> Path:
    from db.entities import RunRecord
    from trainer_core.protocol.status import JobKind, write_kind

    job = paths.run_dir(job_id)
    job.mkdir(parents=True)
    write_kind(job, JobKind.EXPORT)
    store.create_run(RunRecord(id=job.name, name="export", status=RunStatus.RUNNING, kind=JobKind.EXPORT,
                               created_at=time.time()))
    return job


def _pump(store, job: Path, kind=None):
    from trainer_core.jobs import pump
    from trainer_core.jobs.live import LiveRun
    from trainer_core.protocol.status import JobKind

    tracker = pump.Tracker(job.name, job, LiveRun(job.name, "job", RunStatus.RUNNING), 0, None,
                           kind=kind or JobKind.EXPORT)
    pump.drain(tracker, store, max_reads=None)
    pump.flush(tracker, store)
    tracker.log.close()
    return tracker


def test_a_forged_artifact_path_never_becomes_a_row(home, store):
    """/etc/passwd became a row, and Run details offered "Download passwd" to any viewer."""
    from trainer_core.protocol import events as ev

    job = _export_job(store)
    (job / "artifacts").mkdir()
    (job / "artifacts" / "README.md").write_text("card")
    (job / "artifacts" / "evil").symlink_to("/etc/hosts")
    writer = ev.EventWriter(job / ev.LOG_NAME)
    for path in ["/etc/passwd", "../../../../etc/hosts", str(job / "artifacts" / "evil"),
                 str(job / "artifacts" / "README.md")]:
        writer.emit(ev.ArtifactEvent(artifact="card", path=path, size=4, sha256="c" * 64, ts=1.0))
    writer.emit(ev.CompleteEvent(status="completed", output_dir="/etc", ts=2.0))
    writer.close()
    _pump(store, job)
    assert [a.path for a in store.artifacts(job_id=job.name)] == [str(job / "artifacts" / "README.md")]
    warnings = [e.message for e in store.get_events(job.name) if e.kind == "warning"]
    assert [w.split(":")[0] for w in warnings] == ["artifact event ignored"] * 3 + ["complete event"]
    assert warnings[0] == f"artifact event ignored: '/etc/passwd' resolves to /etc/passwd, outside the job's folder {job}"
    assert store.get_run(job.name).output_dir != "/etc"


def test_the_export_page_offers_no_file_outside_the_job_folder(app_home):
    """A row stored before this check (or a file replaced by a symlink since) is not offered for download."""
    from db.entities import RunRecord
    from db.store import Store
    from tests.support.apptest import open_page
    from trainer_core.protocol.status import JobKind

    store = Store()
    job = _export_job(store)
    (job / "artifacts").mkdir()
    (job / "artifacts" / "ok.zip").write_bytes(b"PK")
    (job / "artifacts" / "hosts").symlink_to("/etc/hosts")
    store.add_artifacts([dict(job_id=job.name, path=p, kind="adapter", size=2, sha256="a" * 64, created_at=1.0)
                         for p in ("/etc/passwd", str(job / "artifacts" / "hosts"), str(job / "artifacts" / "ok.zip"))])
    store.finish_run(job.name, RunStatus.COMPLETED)
    at = open_page("pages/run.py", detail_run_id=job.name)
    assert not at.exception
    labels = [b.label for b in at.get("download_button")]
    assert "Download ok.zip" in labels and not [b for b in labels if "passwd" in b or "hosts" in b], labels
    refused = [c.value for c in at.caption if "not offered" in c.value]
    assert len(refused) == 2
    store.engine.dispose()


# ====================================================================== forged event values
def test_a_forged_eval_result_never_reaches_the_database_and_old_rows_do_not_crash_the_pages(home, store):
    """metrics {"exact": "lots", "rouge_l": [1]} made History raise TypeError and Run details ValueError."""
    from trainer_core.protocol import events as ev
    from trainer_core.protocol.status import JobKind
    from ui import evaluation

    job = _export_job(store)
    good = dict(source_key="base:m", base_model="m", data_fingerprint="f", settings_hash="h")
    with open(job / ev.LOG_NAME, "w") as fh:
        fh.write(json.dumps({"kind": "eval_result", "v": 1, "ts": 1.0, **good,
                             "metrics": {"exact": "lots", "rouge_l": [1]}}) + "\n")
        fh.write(json.dumps({"kind": "eval_sample", "v": 1, "ts": 1.0, "index": 2**63 - 1, "prompt": "p",
                             "reference": "r", "answer": "a", "exact": 5.0}) + "\n")
    tracker = _pump(store, job, JobKind.EVAL)
    assert tracker.writes == [] and store.eval_samples(job.name).empty
    warnings = [e.message for e in store.get_events(job.name) if e.kind == "warning"]
    assert len(warnings) == 2 and all(w.startswith("skipped an invalid line at byte ") for w in warnings)
    assert "'exact' to be a number from 0 to 1" in warnings[0] and "'index' is 9223372036854775807" in warnings[1]
    # a row an older version stored: shown empty, never raised on
    assert evaluation.headline({"exact": "lots", "rouge_l": [1]}) == ""
    assert [r["value"] for r in evaluation.metric_rows({"exact": "lots", "rouge_l": [1]}, {"exact": 0.5})] == [None, None]


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
