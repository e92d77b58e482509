"""What a run folder says is checked where it enters: a queued job whose job.json was spoiled fails alone and the
queue moves on, and an over-large job.json is refused before it is parsed; every path read from a run folder (an
artifact, a symlink, an export target) stays inside it; a forged eval result never reaches the database."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from db.entities import RunRecord
from db.store import Store
from tests.support import fake, wait_until
from tests.support.factories import run_folder
from trainer_core.config import BUNDLED_MODEL, ConfigError
from trainer_core.export.spec import ExportSpec
from trainer_core.protocol import events as ev
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus, write_kind
from trainer_core.specs import jobspec
from trainer_core.specs.model_source import ModelSource


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


# ====================================================================== job files have a size limit
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
