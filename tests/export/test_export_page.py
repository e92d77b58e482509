"""Run details' Export section through AppTest: artifacts with size and sha256, a download for a small one and a
path with a copy-ready command for a large one, verify results, and a start refused with the field named."""
from __future__ import annotations

import json
import time

import pytest

from db.entities import RunRecord
from db.store import Store
from tests.support.factories import insert_finished_run
from tests.support.apptest import open_page
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus
from ui.export_panel import DOWNLOAD_MAX_BYTES, copy_command, size_text

RUN, JOB = "20260104-100000-aaaaaa", "20260104-100100-bbbbbb"


@pytest.fixture
def exported(app_home, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    store = Store()
    insert_finished_run(store, RUN, "tone", [2.0, 1.5])
    folder = paths.run_dir(RUN)
    (folder / "adapter").mkdir(parents=True)
    (folder / "config.yaml").write_text(TrainConfig(run_name="tone", model_name=BUNDLED_MODEL).to_yaml())
    (folder / "adapter" / "adapter_config.json").write_text("{}")
    artifacts = paths.run_dir(JOB) / "artifacts"
    artifacts.mkdir(parents=True)
    (artifacts / "tone-adapter.zip").write_bytes(b"PK" + bytes(1000))
    (artifacts / "tone-q8_0.gguf").write_bytes(b"GGUF" + bytes(100))
    store.create_run(RunRecord(id=JOB, name="Export · 100100", status=RunStatus.RUNNING, kind=JobKind.EXPORT,
                               dataset="adapter, gguf (q8_0)", parent_run_id=RUN, created_at=time.time(),
                               total_steps=6))
    store.add_artifacts([
        dict(job_id=JOB, path=str(artifacts / "tone-adapter.zip"), source_run_id=RUN, kind="adapter",
             detail="adapter", size=1002, sha256="a" * 64, created_at=time.time()),
        dict(job_id=JOB, path=str(artifacts / "tone-q8_0.gguf"), source_run_id=RUN, kind="gguf", detail="q8_0",
             size=DOWNLOAD_MAX_BYTES + 1, sha256="b" * 64, created_at=time.time())])  # stands for a large file
    store.append_metrics(JOB, [], events=[(time.time(), "verify", "verify gguf q8_0: 3/3 answers identical to the "
                                                                  "adapter's")])
    store.finish_run(JOB, RunStatus.COMPLETED, steps_done=6)
    yield store
    store.engine.dispose()


def test_run_details_lists_the_exports_artifacts_and_verify_results(exported):
    at = open_page("pages/run.py", detail_run_id=RUN)
    assert "Export" in [s.value for s in at.subheader]
    table = at.dataframe[-1].value
    assert sorted(table["file"]) == ["tone-adapter.zip", "tone-q8_0.gguf"]
    assert set(table["sha256"]) == {"a" * 64, "b" * 64}
    assert [b.label for b in at.get("download_button") if "tone" in b.label] == ["Download tone-adapter.zip"]
    gguf = str(paths.run_dir(JOB) / "artifacts" / "tone-q8_0.gguf")
    assert copy_command(gguf) in [c.value for c in at.code]
    assert any("3/3 answers identical" in m.value for m in at.markdown)


def test_starting_an_export_with_bad_input_names_the_field(exported):
    at = open_page("pages/run.py", detail_run_id=RUN)
    at.text_input(key=f"export_repo_{RUN}").input("me/tone")
    at.multiselect(key=f"export_targets_{RUN}").set_value(["adapter"])
    at.button(key=f"export_start_{RUN}").click().run()
    assert not at.exception
    assert [e.value for e in at.error] == [
        "push_repo_id: a hub push needs a write token: set HF_TOKEN in the environment of the dashboard or CLI "
        "(huggingface.co/settings/tokens), or leave the repo id empty"]
    assert [r.id for r in exported.children(RUN)] == [JOB]  # nothing was recorded


def test_an_export_that_waits_for_a_busy_device_says_queued_not_started(exported):
    """The panel said "started" for an export that was queued behind a running job (hostile review)."""
    at = open_page("pages/run.py", detail_run_id=RUN)  # the orchestrator's start-up checks are done by now
    exported.create_run(RunRecord(id="20260104-110000-cccccc", name="busy", status=RunStatus.RUNNING,
                                  kind=JobKind.TRAIN, devices="cpu", created_at=time.time(), total_steps=10))
    at.multiselect(key=f"export_targets_{RUN}").set_value(["adapter"])
    at.button(key=f"export_start_{RUN}").click().run()
    assert not at.exception and not at.error
    [job] = [r for r in exported.children(RUN) if r.id != JOB]
    assert job.status == RunStatus.QUEUED.value
    assert [m.value for m in at.success if m.value.startswith("Export")] == [f"Export job {job.id} queued: it starts by itself when the jobs before "
                                             "it end; it is listed below."]


def test_sizes_and_copy_commands_are_plain():
    assert (size_text(512), size_text(2_346_502), size_text(144_810_848)) == ("512 B", "2.35 MB", "145 MB")
    assert copy_command("/data/my run/x.gguf") == "cp '/data/my run/x.gguf' ."


def test_the_export_jobs_own_page_lists_its_artifacts(exported):
    at = open_page("pages/run.py", detail_run_id=JOB)
    assert "Artifacts" in [s.value for s in at.subheader] and "Export" not in [s.value for s in at.subheader]
    assert [b.label for b in at.get("download_button") if "tone" in b.label] == ["Download tone-adapter.zip"]


@pytest.mark.parametrize("method, adapter, expected", [
    ("sft", "lora", ["merged", "gguf"]), ("tts", "full", ["merged"]), ("stt", "full", ["merged"]),
    ("embedding", "full", ["merged"]), ("reward", "lora", ["adapter"])])
def test_the_export_form_offers_first_what_the_runs_model_can_be_exported_as(app_home, method, adapter, expected):
    from ui.export_panel import default_targets

    config = TrainConfig(model_name=BUNDLED_MODEL, method=method, adapter=adapter).to_public_dict()
    assert default_targets(config) == expected  # a speech or CSM user is not met by the GGUF refusal first


def test_a_vision_run_is_offered_merged_alone(app_home, tmp_path):
    from ui.export_panel import default_targets

    (tmp_path / "vlm").mkdir()
    (tmp_path / "vlm" / "config.json").write_text(
        '{"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"], "vision_config": {}}')
    assert default_targets({"method": "sft", "model_name": str(tmp_path / "vlm")}) == ["merged"]  # a SigLIP LLaVA


def test_a_vision_run_llama_cpp_converts_is_offered_gguf_too(app_home, tmp_path):
    from ui.export_panel import default_targets

    (tmp_path / "smolvlm").mkdir()  # its config alone (SmolVLM's layout, as tests/support/vision.py builds it)
    (tmp_path / "smolvlm" / "config.json").write_text(json.dumps({
        "architectures": ["Idefics3ForConditionalGeneration"], "model_type": "idefics3", "image_token_id": 49153,
        "text_config": {"architectures": ["VLlama3ForCausalLM"], "model_type": "llama"},
        "vision_config": {"model_type": "idefics3_vision", "image_size": 32, "patch_size": 8}}))
    assert default_targets({"method": "sft", "model_name": str(tmp_path / "smolvlm")}) == ["merged", "gguf"]


def test_with_a_cluster_the_form_offers_it_and_the_job_carries_launcher_ray(exported, monkeypatch):
    at = open_page("pages/run.py", detail_run_id=RUN)
    assert not [r for r in at.radio if r.key == f"export_launcher_{RUN}"]  # no cluster: nothing to choose
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    monkeypatch.delenv("FINETUNE_STUDIO_SHARED_STORAGE", raising=False)
    at = open_page("pages/run.py", detail_run_id=RUN)
    at.radio(key=f"export_launcher_{RUN}").set_value("ray").run()
    at.multiselect(key=f"export_targets_{RUN}").set_value(["adapter"])
    at.button(key=f"export_start_{RUN}").click().run()
    # the spec went to the cluster's checks: the run folders are not on storage the nodes share
    assert any(e.value.startswith("launcher: launcher: ray: run folders must be on storage every node") for e in at.error), \
        [e.value for e in at.error]
    assert [r.id for r in exported.children(RUN)] == [JOB]  # nothing was recorded
