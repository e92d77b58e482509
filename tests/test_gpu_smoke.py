"""bench/gpu_smoke.py in its CPU form (transformers engine, LoRA, a tiny Llama it builds offline; the speech cases
through the studio on a tiny Whisper and a tiny CSM): the same script a bare GPU machine runs, here as part of the
test suite."""
from __future__ import annotations

import pytest

import importlib.util
import json
import math
import os
import subprocess
import sys

from tests.speech_support import ESPEAK, NO_ESPEAK
from tests.support import ROOT

SCRIPT = ROOT / "bench" / "gpu_smoke.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports trainer_core.hardware and config only: dashboard-safe
    return module


def test_cases_per_host():
    smoke = load_script()
    assert smoke.cases(cuda=False, gpus=0) == [("transformers-lora", "transformers", "lora", "sft"),
                                               ("transformers-lora-dpo", "transformers", "lora", "dpo"),
                                               ("transformers-lora-grpo", "transformers", "lora", "grpo")]
    on_two = [name for name, *_ in smoke.cases(cuda=True, gpus=2)]
    assert on_two == ["unsloth-lora", "unsloth-qlora", "unsloth-full", "transformers-lora", "transformers-qlora",
                      "transformers-full", "unsloth-lora-dpo", "unsloth-lora-grpo", "unsloth-lora-grpo-vllm",
                      "transformers-lora-dpo", "transformers-lora-grpo", "transformers-lora-grpo-vllm",
                      "ddp2-transformers-lora", "studio-stt-whisper", "studio-tts-csm"]
    assert "ddp2-transformers-lora" not in [name for name, *_ in smoke.cases(cuda=True, gpus=1)]
    speech = [("studio-stt-whisper", "studio", "full", "stt"), ("studio-tts-csm", "studio", "full", "tts")]
    assert smoke.cases(cuda=True, gpus=1)[-2:] == speech  # on every GPU host; on a CPU only when asked for
    assert smoke.cases(cuda=False, gpus=0, speech_only=True) == smoke.cases(cuda=True, gpus=2, speech_only=True) == speech
    assert smoke.skip_reason("studio", "full", "stt") == smoke.skip_reason("studio", "full", "tts") == (
        "" if ESPEAK else NO_ESPEAK)
    assert smoke.skip_reason("transformers", "lora", "grpo-vllm") == ("" if smoke.hardware.has_module("vllm") else
                                                                     "vllm is not installed (pip install -e '.[vllm]')")


@pytest.mark.train  # trains a tiny Llama in a subprocess
def test_gpu_smoke_runs_on_cpu_with_a_tiny_llama_built_offline(tmp_path):
    env = {**os.environ, "FINETUNE_STUDIO_FORCE_CPU": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.pop("FINETUNE_STUDIO_HOME", None)
    result = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--steps", "6", "--out", str(tmp_path)],
                            capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cuda"] is False and summary["model"] == str(tmp_path / "tiny-llama")
    case, dpo, grpo = summary["results"]
    assert (dpo["case"], dpo["objective"], grpo["case"], grpo["objective"]) == (
        "transformers-lora-dpo", "dpo", "transformers-lora-grpo", "grpo")
    for other in (dpo, grpo):  # each objective trained its steps and saved an adapter
        assert math.isfinite(other["first_loss"]) and math.isfinite(other["last_loss"]) and other["steps_per_s"] > 0
        assert {"adapter_config.json", "adapter_model.safetensors"} <= set(other["files"])
    assert "rewards/margins" in dpo["last_metrics"] and "rewards/length/mean" in grpo["last_metrics"]
    assert case["case"] == "transformers-lora" and case["device"] == "cpu"
    assert case["weight_dtype"] == "torch.float32" and case["compute_dtype"] == "fp32"
    assert (case["eos_token"], case["pad_token"]) == ("<|im_end|>", "<|im_end|>")
    # LoRA r=16 on every projection of 2 layers (hidden 64, kv 32, MLP 128), as the estimate counts them
    assert case["trainable_params"] == case["estimate_trainable_params"] == 32_768
    assert math.isfinite(case["first_loss"]) and math.isfinite(case["last_loss"])
    assert case["tokens_per_s"] > 0 and case["peak_reserved_mb"] > 0 and case["estimate_gb"] > 0
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= set(case["files"])
    assert summary["goals"] == ["goals: need a GPU (Unsloth speed and memory, estimate accuracy); CPU figures "
                                "are for the test"]
    assert case["base_dtype"] == "torch.float32"  # CPU: the frozen base in fp32 too
    assert "transformers-lora: engine transformers, trained weights torch.float32, frozen base torch.float32, " \
        "compute fp32" in result.stdout


def test_a_speech_case_without_espeak_is_listed_as_skipped(tmp_path, monkeypatch):
    smoke = load_script()
    monkeypatch.setattr(smoke, "ESPEAK", None)
    assert smoke.run_case("studio-tts-csm", "studio", "full", "-", 4, tmp_path, "tts") == {
        "case": "studio-tts-csm", "skipped": "espeak-ng is not installed (apt-get install espeak-ng; .ci/run installs it)"}
    assert smoke.describe({"case": "studio-tts-csm", "skipped": NO_ESPEAK}) == f"studio-tts-csm: skipped: {NO_ESPEAK}"


@pytest.mark.train  # a Whisper and a CSM run through the CLI and a worker process
@pytest.mark.subprocess
@pytest.mark.skipif(ESPEAK is None, reason=NO_ESPEAK)
def test_speech_cases_run_through_the_studio_on_cpu(tmp_path):
    env = {**os.environ, "FINETUNE_STUDIO_FORCE_CPU": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT),
           "HF_HUB_CACHE": str(tmp_path / "no-hub-cache"), "OMP_NUM_THREADS": "1"}  # the tiny Whisper, built here
    env.pop("FINETUNE_STUDIO_HOME", None)
    result = subprocess.run([sys.executable, str(SCRIPT), "--speech-only", "--steps", "4", "--out", str(tmp_path)],
                            capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    stt, tts = json.loads((tmp_path / "summary.json").read_text())["results"]
    assert (stt["case"], stt["method"], stt["model"]) == ("studio-stt-whisper", "stt", str(tmp_path / "tiny-whisper"))
    assert (tts["case"], tts["method"], tts["model"]) == ("studio-tts-csm", "tts", str(tmp_path / "tiny-csm"))
    for case in (stt, tts):  # each trained its 4 steps in a worker the orchestrator started, and saved the model
        assert (case["device"], case["status"], case["steps"]) == ("cpu", "completed", 4)
        assert math.isfinite(case["first_loss"]) and math.isfinite(case["last_loss"])
        assert case["steps_per_s"] > 0 and case["peak_reserved_mb"] > 0
        assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= set(case["files"])
    assert tts["samples"] == ["samples/step-000004-0.wav"]  # the spoken sample at the end of training
    assert stt["samples"] == []
    assert "studio-stt-whisper: stt through the studio on cpu" in result.stdout
