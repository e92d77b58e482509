"""Exporting a text-to-speech run (issue 22): a tiny Sesame CSM tuned with LoRA, exported as a user would (through the
orchestrator and a real export worker). The adapter is merged into CsmForConditionalGeneration and saved with the
processor; the export verifies it by reloading the folder, which must speak the run's sample sentence with the
sampler's seed sample for sample as the model did before it was saved. The model card's own loading code then runs
in a fresh interpreter against the folder and writes a WAV clip. GGUF is refused before start: llama.cpp cannot run
CSM. The adapter's config is edited to name another base model first: the export merges into the run's base."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.speech.test_tts_train import tts_config
from tests.support.speech import ESPEAK, NO_ESPEAK, PHRASES
from tests.support import run_python
from trainer_core.methods.tts import TtsSettings
from trainer_core.export.spec import TTS_NO_GGUF, ExportSpec
from trainer_core.specs.model_source import ModelSource, resolve
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus
from trainer_core.worker.export_verify import compare_clips

# The card's code block, run as it is but for the folder it names (and where the clip goes)
CHECK_CLIP = """
import sys, soundfile
info = soundfile.info(sys.argv[1])
print("CLIP", info.samplerate, info.channels, round(info.duration, 2))
"""
# How far the merged weights moved from the base's, layer by layer, where LoRA adapted them (a merge that dropped
# the adapter would leave them equal)
WEIGHTS_MOVED = """
import sys
from safetensors.torch import load_file
merged, base = load_file(sys.argv[1] + "/model.safetensors"), load_file(sys.argv[2] + "/model.safetensors")
adapted = [k for k in base if k.endswith(("q_proj.weight", "v_proj.weight")) and not k.startswith("codec_model")]
moved = [k for k in adapted if not (merged[k].float() - base[k].to(merged[k].dtype).float()).abs().max() == 0]
kept = all((merged[k].float() == base[k].to(merged[k].dtype).float()).all() for k in base
           if k.startswith("codec_model"))
print("MOVED", len(moved), len(adapted), "CODEC_KEPT", kept)
"""


@pytest.mark.skipif(ESPEAK is None, reason=NO_ESPEAK)
@pytest.mark.train
@pytest.mark.subprocess
def test_a_tts_lora_run_exports_merged_with_its_processor_and_the_reloaded_folder_speaks_alike(studio, tmp_path):
    cfg = tts_config(tmp_path, adapter="lora", max_steps=40, eval_steps=40, lora_r=8, lora_alpha=16,
                     method_settings=TtsSettings(max_sample_s=2.0, sample_texts=[PHRASES[0]], eval_on_start=False))
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 80)}"
    source = ModelSource(run_id=run_id)
    adapter = resolve(source).adapter_dir
    assert adapter is not None and (adapter / "processor_config.json").exists()

    # llama.cpp cannot run CSM: named before anything starts, with what to export instead
    assert [e.message for e in ExportSpec(source=source, targets=["merged", "gguf"]).validate()
            if e.field == "targets"] == [f"gguf: {TTS_NO_GGUF}: export merged"]

    # hostile: the adapter's config names another base; the export merges into the run's own base (its config.yaml)
    settings = json.loads((adapter / "adapter_config.json").read_text())
    settings["base_model_name_or_path"] = str(tmp_path / "somewhere-else")
    (adapter / "adapter_config.json").write_text(json.dumps(settings))

    job_id = studio.submit(ExportSpec(source=source, targets=["merged"], verify=True))
    snap = studio.wait(job_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(job_id, 80)}"

    folder = paths.run_dir(job_id) / "artifacts"
    merged = folder / "merged"
    names = {p.name for p in merged.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "processor_config.json",
            "tokenizer_config.json"} <= names, names
    assert not any(n.startswith("adapter_") for n in names), names  # merged: no adapter left to apply
    assert json.loads((merged / "config.json").read_text())["architectures"] == ["CsmForConditionalGeneration"]
    verify = json.loads((folder / "verify.json").read_text())
    print("\ntts export verify", verify)
    assert [(v["format"], v["identical"], v["total"], v["first_difference"]) for v in verify] == [("merged", 1, 1, "")]
    assert [e.message for e in studio.events(job_id) if e.kind == "verify"] == [
        "verify merged: 1/1 answers identical to the adapter's"]

    spoke = re.search(r"verify: the reloaded folder spoke .* for (\d+\.\d+) s", studio.log_text(job_id))
    assert spoke and float(spoke.group(1)) > 0, studio.log_tail(job_id, 40)  # a clip, not two empty ones alike
    moved = run_python(WEIGHTS_MOVED, str(merged), str(cfg.model_name))
    assert moved.returncode == 0, moved.stderr[-2000:]
    print(moved.stdout.strip(), f"verify spoke {spoke.group(1)} s")
    _, changed, adapted, _, codec_kept = moved.stdout.split()
    assert int(adapted) > 0 and int(changed) == int(adapted) and codec_kept == "True", moved.stdout

    card = (folder / "README.md").read_text()
    assert "## How to use" in card and "There is no GGUF: llama.cpp cannot run" in card and "it loads in transformers only" in card
    assert "clips identical sample for sample" in card
    code = re.search(r"```python\n(.*?)\n```", card, re.DOTALL).group(1)
    assert 'folder = "merged"' in code
    clip = tmp_path / "speech.wav"
    code = code.replace('folder = "merged"', f"folder = {str(merged)!r}").replace('"speech.wav"', repr(str(clip)))
    result = run_python(code)  # a fresh interpreter: nothing of this studio imported, the card's code alone
    assert result.returncode == 0, result.stderr[-3000:]
    checked = run_python(CHECK_CLIP, str(clip))
    assert checked.returncode == 0, checked.stderr[-2000:]
    rate, channels, seconds = checked.stdout.split("CLIP")[-1].split()
    print(f"the card's code spoke {seconds} s")
    assert (int(rate), int(channels)) == (24000, 1) and float(seconds) > 0


def test_verify_counts_a_clip_identical_only_when_every_sample_and_the_ending_agree():
    rate = 100
    clip = np.linspace(-1, 1, 150, dtype=np.float32)
    later = clip.copy()
    later[120] += 1e-6  # one sample, 1.2 s in
    reference = [("open the door", clip, True), ("close it", clip, True)]
    assert compare_clips("merged", reference, [("open the door", clip.copy(), True), ("close it", clip, True)], rate) \
        == dict(format="merged", identical=2, total=2, first_difference="")
    assert compare_clips("merged", reference, [("open the door", clip, True), ("close it", later, True)], rate) == dict(
        format="merged", identical=1, total=2,
        first_difference="sentence 2 ('close it'): apart from 1.20 s; 1.50 s before saving, 1.50 s reloaded")
    shorter = compare_clips("merged", reference, [("open the door", clip[:90], True), ("close it", clip, False)], rate)
    assert (shorter["identical"], shorter["first_difference"]) == (
        0, "sentence 1 ('open the door'): apart from 0.90 s; 1.50 s before saving, 0.90 s reloaded")
