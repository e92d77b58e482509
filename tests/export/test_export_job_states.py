"""An export job's folders and states: a chosen out_dir stays inside an export folder; a killed export takes its
converter along and its staging folder is removed by the next start or by an orchestrator adopting the job; the
timeline names the job kind, the CLI says queued while the export waits for the device, and a completed export
shows every step done; the eval and export panels name a running job by its kind."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from db.entities import RunRecord
from db.store import Store
from tests.support import ROOT
from trainer_core.specs import jobspec
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.export import card, staging
from trainer_core.export.spec import ExportSpec
from trainer_core.jobs import pump
from trainer_core.jobs.live import LiveRun
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import events as ev, paths
from trainer_core.protocol.status import JobKind, RunStatus, write_kind
from trainer_core.worker import export as worker_export
from trainer_core.worker.export import ExportWorker, Plan

RUN = "20260124-100000-aaaaaa"
# the card a finished export writes (its content is not what these tests read)
STUDIO_CARD = card.render(title="m", source_label="tone · final", base_model=BUNDLED_MODEL, method="SFT · LoRA",
                          data="", config={}, facts=card.RunFacts(), artifacts=[], verify=[], chart_file=None)
@pytest.fixture
def run(home, monkeypatch):
    """A finished LoRA run (named only: nothing here loads it)."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    folder = paths.run_dir(RUN)
    (folder / "adapter").mkdir(parents=True)
    (folder / "config.yaml").write_text(TrainConfig(run_name="tone", model_name=BUNDLED_MODEL).to_yaml())
    (folder / "adapter" / "adapter_config.json").write_text("{}")
    return folder


def errors(spec: ExportSpec) -> dict[str, str]:
    found: dict[str, str] = {}
    for error in spec.validate():
        found.setdefault(error.field, error.message)
    return found


# ====================================================================== out_dir
def test_a_chosen_out_dir_stays_inside_an_export_folder(run, tmp_path):
    """out_dir accepted any new folder under the data root or the project checkout: a run's folder, models/,
    the code. Only the exports/ folder of the data root or of an allowed root takes artifacts."""
    home = paths.data_root()
    exports = [home / "exports", tmp_path / "exports"]
    outside = {str(paths.run_dir(RUN) / "x"): paths.run_dir(RUN) / "x", str(home / "models" / "x"): home / "models" / "x",
               str(tmp_path / "code"): tmp_path / "code"}
    for given, resolved in outside.items():
        assert errors(ExportSpec(source=ModelSource(run_id=RUN), targets=["adapter"], out_dir=given)) == {
            "out_dir": f"{given} resolves to {resolved}, which is outside the allowed folders "
                       f"({exports[0]}, {exports[1]}): exports go in a new folder under {exports[0]} or {exports[1]}"}
    (tmp_path / "exports").mkdir()
    (tmp_path / "exports" / "link").symlink_to(paths.run_dir(RUN))  # a symlink out of the export folder
    assert "which is outside the allowed folders" in errors(ExportSpec(
        source=ModelSource(run_id=RUN), targets=["adapter"], out_dir=str(tmp_path / "exports" / "link" / "x")))["out_dir"]
    assert errors(ExportSpec(source=ModelSource(run_id=RUN), targets=["adapter"], out_dir=str(exports[1]))) == {
        "out_dir": f"{exports[1]} is the export folder itself: name a new folder inside it, e.g. "
                   f"{exports[1] / 'my-export'}"}
    fine = ExportSpec(source=ModelSource(run_id=RUN), targets=["adapter"], out_dir=str(home / "exports" / "mine"))
    assert errors(fine) == {} and fine.output_dir(run) == home / "exports" / "mine"  # exports/ is made on demand


# ====================================================================== a killed export
FAKE_CONVERTER = textwrap.dedent("""
    import os, sys, time
    out = sys.argv[1]
    open(out + ".pid", "w").write(str(os.getpid()))
    with open(out, "ab") as fh:
        while True:  # a conversion that takes long: it writes into the staging folder until it is killed
            fh.write(b"GGUF"); fh.flush(); time.sleep(0.05)
""")

# The export worker's own code around a conversion: its staging folder (locked), then run_tool on a converter.
KILLED_WORKER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from trainer_core.export import staging
    from trainer_core.worker.export import ExportWorker
    job, converter = Path(sys.argv[1]), sys.argv[2]
    worker = ExportWorker(job)
    worker.begin()
    folder, _ = staging.create(job / "artifacts")
    worker.run_tool([sys.executable, converter, str(folder / "m-q8_0.gguf")], "convert_hf_to_gguf")
""")


def export_job(job_id: str, spec: ExportSpec) -> Path:
    job = paths.run_dir(job_id)
    job.mkdir(parents=True)
    jobspec.write_spec(job, spec)
    write_kind(job, JobKind.EXPORT)
    return job


def wait_for(condition, what: str, limit_s: float = 120.0):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"still waiting for {what} after {limit_s:.0f}s")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def worker_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_a_killed_export_takes_its_converter_along_and_the_next_start_removes_its_staging(run, tmp_path):
    """SIGKILL of the worker left the converter writing into .artifacts.tmp-<pid> (it shared no fate with the
    worker), and the staging folder stayed forever (274 MB for the bundled model)."""
    job = export_job("20260124-100001-killed", ExportSpec(source=ModelSource(run_id=RUN), targets=["gguf"]))
    converter = tmp_path / "fake_convert.py"
    converter.write_text(FAKE_CONVERTER)
    worker = subprocess.Popen([sys.executable, "-c", KILLED_WORKER, str(job), str(converter)], env=worker_env(),
                              cwd=job, start_new_session=True)
    folder = job / f".artifacts.tmp-{worker.pid}"
    pid_file = folder / "m-q8_0.gguf.pid"
    converter_pid = int(wait_for(lambda: pid_file.is_file() and pid_file.read_text(), "the converter to start"))
    assert psutil.Process(converter_pid).ppid() == worker.pid
    os.kill(worker.pid, signal.SIGKILL)
    assert worker.wait() == -signal.SIGKILL
    wait_for(lambda: gone(converter_pid), "the converter to die with its worker")
    assert folder.is_dir()  # a SIGKILL leaves it: the next start removes it

    # A staging folder someone holds (this process, as a live worker would) is left alone.
    live_job = export_job("20260124-100002-living", ExportSpec(source=ModelSource(run_id=RUN), targets=["adapter"]))
    live, lock = staging.create(live_job / "artifacts")
    try:
        broken = export_job("20260124-100003-nextup", ExportSpec(source=ModelSource(run_id="20260124-000000-gone00"),
                                                                  targets=["adapter"]))
        done = subprocess.run([sys.executable, "-m", "trainer_core.worker", str(broken)], env=worker_env(),
                              cwd=broken, capture_output=True, text=True, timeout=600)
        assert done.returncode == 1, done.stderr[-2000:]
        assert f"removed the stale staging folder {folder}" in done.stdout
        assert not folder.exists() and live.is_dir()
    finally:
        os.close(lock)


def test_an_orchestrator_adopting_an_export_job_removes_its_dead_workers_staging(run):
    job = export_job("20260124-100004-adopt0", ExportSpec(source=ModelSource(run_id=RUN), targets=["adapter"]))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = job / f".artifacts.tmp-{dead.pid}"
    (left / "merged").mkdir(parents=True)
    (left / "merged" / "model.safetensors").write_bytes(b"w" * 100)
    store = Store()
    store.create_run(RunRecord(id=job.name, name="export", status=RunStatus.RUNNING.value, kind=JobKind.EXPORT,
                               created_at=time.time(), started_at=time.time(), pid=dead.pid,
                               pid_started_at=time.time() - 5, output_dir=str(job)))
    orch = Orchestrator(store, start_pump=False)  # adopts the jobs nobody follows as it starts
    try:
        assert not left.exists()
    finally:
        orch.close()


# ====================================================================== the job's states as shown
def test_the_timeline_names_the_job_kind_not_training(run):
    """The timeline said "Training: publish" for an export and "Training: generating" for an eval."""
    for kind, phase, expected in [(JobKind.EXPORT, "publish", "Exporting: publish"),
                                  (JobKind.EVAL, "generating", "Evaluating: generating"),
                                  (JobKind.TRAIN, "training", "Training: training")]:
        tracker = pump.Tracker("20260124-100005-tl0000", run, LiveRun("x", kind.value, RunStatus.RUNNING), 0, None,
                               kind=kind)
        pump.handle(tracker, ev.StatusEvent(status=RunStatus.RUNNING.value, phase=phase))
        assert tracker.timeline[-1][1:] == ("status", expected)
        tracker.log.close()


def test_the_cli_says_queued_when_the_export_waits_for_the_device(run, monkeypatch, capsys):
    """The CLI printed "export job ... started" for a job that sat in the queue behind a training run."""
    from tests.support.factories import insert_finished_run
    from trainer_core.__main__ import main

    monkeypatch.delenv("FINETUNE_STUDIO_TOKEN", raising=False)
    store = Store()
    insert_finished_run(store, RUN, "tone", [2.0, 1.5])
    me = psutil.Process()
    store.create_run(RunRecord(id="20260124-100006-busy00", name="busy", status=RunStatus.RUNNING.value,
                               created_at=time.time(), started_at=time.time(), devices="cpu", pid=me.pid,
                               pid_started_at=me.create_time()))  # alive, no folder: nobody adopts it
    store.engine.dispose()
    monkeypatch.setattr(Orchestrator, "wait", lambda self, job_id, **kw: SimpleNamespace(
        status=RunStatus.CANCELLED, warnings=[], error=""))
    assert main(["export", RUN, "--to", "adapter"]) == 3
    first = capsys.readouterr().err.splitlines()[0]
    assert re.fullmatch(rf"export job \S+ queued for run {RUN}: it starts when the device is free \(Ctrl-C cancels "
                        r"it\)", first), first
    signal.signal(signal.SIGINT, signal.default_int_handler)


def test_a_completed_export_shows_every_step_done(run, monkeypatch):
    """A finished adapter export showed 3/4 steps (and merged + GGUF 6/7): preflight was one of the steps but never
    counted. The stages are the worker's own; only the ones that need a model are played here."""
    job = export_job("20260124-100007-steps0", ExportSpec(source=ModelSource(run_id=RUN), targets=["adapter"],
                                                          verify=False))
    spec = jobspec.read_spec(job)

    def preflight(self, spec):
        final = spec.output_dir(self.run_dir)
        resolved = SimpleNamespace(source=spec.source, served_name="m", label="tone · final")
        return Plan(spec, resolved, final=final, staging=staging.staging_path(final), base_dir="")

    def zip_weights(self, plan):
        (plan.staging / "m-adapter.zip").write_bytes(b"PK")
        plan.staged.append(worker_export.Staged("m-adapter.zip", "adapter", "adapter"))

    def write_card(self, plan):
        (plan.staging / "README.md").write_text(STUDIO_CARD)
        plan.staged.append(worker_export.Staged("README.md", "card"))

    monkeypatch.setattr(ExportWorker, "preflight", preflight)
    monkeypatch.setattr(ExportWorker, "zip_weights", zip_weights)
    monkeypatch.setattr(ExportWorker, "write_card", write_card)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert ExportWorker(job).run() == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    events = ev.read_new(job / ev.LOG_NAME, 0)[0]
    progress = [(e.step, e.total_steps) for e in events if e.kind == "progress"]
    assert spec.stages() == ["preflight", "adapter", "model card", "publish"]
    assert progress == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert (events[-1].kind, events[-1].status, events[-1].steps) == ("complete", "completed", 4)


# ====================================================================== a running eval or export is not "Training"
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
