"""Exporting a speech-to-text run (issue 22): the merged model folder with its processor, verified by reload (the
merged folder transcribes the run's own clips exactly as the run's model does), through the orchestrator and a real
export worker. A full fine-tune and a LoRA run (its adapter merged into the Whisper base). The merged folder of the
full run also transcribes a recording it never heard, in a fresh interpreter."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.speech.test_stt_train import TRANSCRIBE, speech_config
from tests.support.speech import ESPEAK, NO_ESPEAK, PHRASES, speak
from tests.support import run_python
from trainer_core.export.spec import ExportSpec
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus

# the run's own script, with the features cast to the merged weights' dtype (bfloat16 by default)
TRANSCRIBE_16 = TRANSCRIBE.replace(".input_features\n", ".input_features.to(model.dtype)\n")
assert TRANSCRIBE_16 != TRANSCRIBE

pytestmark = [pytest.mark.skipif(ESPEAK is None, reason=NO_ESPEAK), pytest.mark.train, pytest.mark.subprocess]


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_a_speech_run_exports_merged_with_its_processor_and_verifies_by_its_transcripts(studio, tmp_path, adapter):
    fields = {"adapter": adapter}
    if adapter == "lora":  # a few steps: what matters is that merged and unmerged transcribe alike
        fields.update(max_steps=20, eval_steps=20, learning_rate=1e-3, lora_r=8, lora_alpha=16)
    run_id = studio.start(speech_config(tmp_path, **fields))
    snap = studio.wait(run_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 80)}"

    assert [e.field for e in ExportSpec(source=ModelSource(run_id=run_id), targets=["gguf"]).validate()
            if e.field == "targets"] == ["targets"]  # no GGUF for Whisper, named before start
    job_id = studio.submit(ExportSpec(source=ModelSource(run_id=run_id), targets=["merged"], verify=True))
    snap = studio.wait(job_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(job_id, 80)}"

    folder = paths.run_dir(job_id) / "artifacts"
    merged = folder / "merged"
    assert {"model.safetensors", "config.json", "tokenizer_config.json"} <= {p.name for p in merged.iterdir()}
    assert any((merged / n).exists() for n in ("processor_config.json", "preprocessor_config.json"))
    verify = json.loads((folder / "verify.json").read_text())
    print(f"\n{adapter}: speech export verify", verify)
    assert [(v["format"], v["identical"], v["total"]) for v in verify] == [("merged", 4, 4)]
    assert [e.message for e in studio.events(job_id) if e.kind == "verify"] == [
        "verify merged: 4/4 answers identical to the adapter's"]

    if adapter == "full":
        clip = speak(PHRASES[3], tmp_path / "fresh.wav", speed=168, pitch=47)
        result = run_python(TRANSCRIBE_16, str(merged), str(clip))
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.split("TRANSCRIPT:")[-1].strip() == PHRASES[3]


def test_a_speech_export_whose_clips_are_gone_fails_before_publishing(studio, tmp_path):
    run_id = studio.start(speech_config(tmp_path, max_steps=2, eval_steps=2))
    assert studio.wait(run_id, timeout=600).status is RunStatus.COMPLETED
    for clip in Path(tmp_path / "speech" / "eval").glob("*.wav"):
        clip.unlink()  # the run's clips, deleted after training
    for clip in Path(tmp_path / "speech" / "train").glob("*.wav"):
        clip.unlink()
    job_id = studio.submit(ExportSpec(source=ModelSource(run_id=run_id), targets=["merged"], verify=True))
    snap = studio.wait(job_id, timeout=600)
    assert snap.status is RunStatus.FAILED
    assert "the run's clips cannot be read to verify the merged model" in snap.error, snap.error
    assert "export with verify off" in snap.error
    assert not (paths.run_dir(job_id) / "artifacts" / "merged").exists()  # nothing published
