"""Issue 24 items whose fix had no regression test of its own (found by an audit of the issue's list), and one
that was still open: `db rebuild` after the data root moved rebased a run's output folder in the report only.

- Wrong states 8: a job whose journal is gone or lost its first line comes back from job.json; an eval that never
  reported keeps its result row (its baseline is found, not queued twice); serve's "serving at" line is kept.
- Wrong states 11: an over-large job.json is refused before it is parsed, with the limit.
- Cosmetic: rebuild when the data root moved (or a folder was copied) reads every recorded path under the
  folder's new place: the output folder, checkpoints and export artifacts, without false "outside" warnings.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import pytest

from db.entities import RunRecord
from db.store import Store
from tests.jobs.test_rebuild import wipe
from tests.support import ROOT, fake
from tests.support.factories import run_folder
from trainer_core.specs import jobspec
from trainer_core.config import BUNDLED_MODEL, ConfigError
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.export.spec import ExportSpec
from trainer_core.jobs import evals, rebuild
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import events as ev
from trainer_core.protocol import journal, paths
from trainer_core.protocol.status import JobKind, RunStatus, write_kind
from trainer_core.serving.spec import ServeSpec, hash_key

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


# ====================================================================== cosmetic: rebuild after the data root moved
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


# ====================================================================== wrong states 8: rebuild keeps every job it can
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


# ====================================================================== wrong states 11: job files have a size limit
def test_an_oversized_job_json_is_refused_before_parsing_with_the_limit(home):
    job = paths.run_dir("20260102-100005-eeeeee")
    job.mkdir(parents=True)
    write_kind(job, JobKind.EXPORT)
    (job / jobspec.SPEC_FILE).write_text('{"name": "' + "x" * jobspec.SPEC_BYTES_MAX + '"}')
    with pytest.raises(ConfigError) as info:
        jobspec.read_spec(job)
    [error] = info.value.errors
    assert error.field == jobspec.SPEC_FILE and f"{jobspec.SPEC_BYTES_MAX:,} bytes" in error.message
    (job / jobspec.SPEC_FILE).write_text(json.dumps(ExportSpec(source=ModelSource(model=BUNDLED_MODEL),
                                                               targets=["adapter"]).to_dict()))
    assert jobspec.read_spec(job).targets == ["adapter"]  # a real spec is far below the limit


# ====================================================================== security 14: the journal is a run folder's file
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


# ====================================================================== cosmetic: a running eval or export is not "Training"
def test_eval_and_export_panels_name_a_running_job_by_its_kind():
    """The timeline was fixed ("Evaluating: generating"), but the eval picker, its result header and the export
    job's title still said "Training" for a running eval or export."""
    from db.entities import EvalResultRecord
    from ui import evaluation, export_panel

    result = EvalResultRecord(job_id="e", source_key="run:r", source_run_id="r", checkpoint=None, base_model="m",
                              data_fingerprint="f", settings_hash="h", data_label="test.jsonl", metrics=None,
                              created_at=0.0, status=RunStatus.RUNNING)
    assert evaluation._result_label(result).endswith(" · test.jsonl · Evaluating")
    job = RunRecord(id="x", name="export", status=RunStatus.RUNNING, kind=JobKind.EXPORT, dataset="adapter")
    assert export_panel._title(job) == "🏃 export · adapter · Exporting"
    assert export_panel._title(job.replace(status=RunStatus.COMPLETED)) == "✅ export · adapter · Completed"
