"""What a run's model is decides what the studio offers after training (MethodSpec.output): a reward model scores
answers, an embedding model makes vectors, a Whisper model transcribes. None of them writes chat answers, so the
Playground's chat does not list them, and a merged/GGUF export of a reward model (which loads a model that writes
answers and verifies it by its answers) is refused before start, naming what the model is for; so is serving. A
speech model is served for transcription and exported merged (verified by its transcripts), an embedding model
exported as its sentence-transformers folder (verified by its embeddings); neither as GGUF. A text-to-speech (CSM) model
is exported merged (verified by what it speaks), never as GGUF (llama.cpp cannot run CSM), and is neither served (no
OpenAI-compatible speech route here) nor evaluated (its eval loss is charted during training). Before, these jobs
started and failed late in the worker, or (a reward run's LoRA merged into a causal LM) produced a model without its
score head."""
from __future__ import annotations

import json
import time

import pytest

from db.entities import RunRecord
from trainer_core import methods
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.export.spec import TTS_NO_GGUF, ExportSpec
from trainer_core.specs.model_source import ModelSource, SourceError, resolve
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus
from trainer_core.serving.spec import ServeSpec, vllm_fits
from ui.playground import offered_runs, run_modes

RUNS = {"dpo": "20260105-000000-0d0d0d", "grpo": "20260105-000000-06a06a", "reward": "20260105-000000-4e4e4e",
        "embedding": "20260105-000000-e3e3e3", "stt": "20260105-000000-5a5a5a", "tts": "20260105-000000-7d7d7d"}


def write_run(run_id: str, method: str) -> TrainConfig:
    cfg = TrainConfig(model_name=BUNDLED_MODEL, run_name=f"my {method}", method=method,
                      adapter="full" if method in ("stt", "tts") else "lora")
    folder = paths.run_dir(run_id)
    weights = folder / ("adapter" if cfg.effective_use_lora else "model")
    weights.mkdir(parents=True)
    (weights / ("adapter_config.json" if cfg.effective_use_lora else "config.json")).write_text("{}")
    (folder / "config.yaml").write_text(cfg.to_yaml())
    return cfg


@pytest.fixture
def runs(home):
    return {method: write_run(run_id, method) for method, run_id in RUNS.items()}


def test_every_registered_method_says_what_its_model_is():
    outputs = {name: spec.output for name, spec in methods.METHODS.items()}
    assert set(outputs.values()) <= {"text", "reward", "embedding", "speech", "audio"}
    assert (outputs["sft"], outputs["dpo"], outputs["grpo"], outputs["reward"], outputs["embedding"],
            outputs["stt"], outputs["tts"]) == ("text", "text", "text", "reward", "embedding", "speech", "audio")


@pytest.mark.parametrize("method, words", [
    ("reward", ("Reward model (from pairs)", "scores answers", "GRPO run's reward model")),
    ("embedding", ("Embedding model", "vectors", "SentenceTransformer(folder)")),
    ("stt", ("Speech-to-text", "transcribes audio", "WhisperForConditionalGeneration")),
    ("tts", ("Text-to-speech (CSM)", "speaks text", "no server here generates speech", "/v1/audio/speech",
             "Playground's Text to speech mode", "CsmForConditionalGeneration and AutoProcessor"))])
def test_a_model_that_does_not_write_answers_is_not_served_as_chat_nor_exported_merged(runs, method, words):
    source = ModelSource(run_id=RUNS[method])
    problems = [e for e in ServeSpec(source=source, sources=[source], api_key_hash="0" * 64).validate()
                if e.field == "source"]
    if method == "stt":  # served for transcription (POST /v1/audio/transcriptions), not chat
        assert problems == []
    else:
        assert len(problems) == 1, problems
        message = problems[0].message
        assert message.startswith(f"my {method} · final was trained with ") and "cannot be served" in message
        assert all(w in message for w in words), message
        assert str(resolve(source).weights_dir) in message  # where the model is, for the use that fits it

    exported = [e for e in ExportSpec(source=source, targets=["merged", "gguf"]).validate() if e.field == "targets"]
    merged_alone = [e for e in ExportSpec(source=source, targets=["merged"]).validate() if e.field == "targets"]
    if method == "stt":  # merged (verified by its transcripts), but no GGUF: llama.cpp converts language models
        assert [e.message for e in exported] == ["gguf: a speech-to-text model is not converted to GGUF here "
                                                 "(llama.cpp's converter takes language models): export merged"]
        assert merged_alone == []
    elif method == "tts":  # merged (verified by what it speaks); llama.cpp cannot run CSM: transformers only
        assert [e.message for e in exported] == [f"gguf: {TTS_NO_GGUF}: export merged"]
        assert "llama.cpp cannot run" in TTS_NO_GGUF and "transformers only" in TTS_NO_GGUF
        assert merged_alone == []
    elif method == "embedding":  # a sentence-transformers folder (a full run's); this run trained LoRA
        assert [e.message.split(":")[0] for e in exported] == ["gguf"]
        assert "sentence-transformers folder" in exported[0].message
        assert [e.message.split(":")[0] for e in merged_alone] == ["merged"]
        assert "export the adapter" in merged_alone[0].message
    else:
        assert [e.message.split(":")[0] for e in exported] == ["merged and gguf"]
        assert all(w in exported[0].message for w in words), exported[0].message
        assert exported[0].message.endswith("export the adapter instead"), exported[0].message
        assert len(merged_alone) == 1
    assert not [e for e in ExportSpec(source=source, targets=["adapter"]).validate() if e.field == "targets"]


def test_a_model_that_writes_answers_is_served_from_any_method(runs):
    for method in ("dpo", "grpo"):
        source = ModelSource(run_id=RUNS[method])
        serve_fields = {e.field for e in ServeSpec(source=source, sources=[source], api_key_hash="0" * 64).validate()}
        assert "source" not in serve_fields and not any(f.startswith("sources") for f in serve_fields)
        assert not [e for e in ExportSpec(source=source, targets=["merged"]).validate() if e.field == "targets"]


def test_a_second_source_that_cannot_chat_is_named_by_its_position(runs):
    first, second = ModelSource(run_id=RUNS["dpo"]), ModelSource(run_id=RUNS["reward"])
    problems = {e.field for e in ServeSpec(source=first, sources=[first, second], api_key_hash="0" * 64).validate()}
    assert "sources[1]" in problems and "source" not in problems


def test_the_playground_lists_only_runs_whose_model_writes_answers(runs, orch):
    for method, run_id in RUNS.items():
        orch.store.create_run(RunRecord(id=run_id, name=f"my {method}", status=RunStatus.COMPLETED,
                                        kind=JobKind.TRAIN, created_at=time.time(),
                                        config_json=json.dumps(runs[method].to_public_dict())))
    listed = orch.list_runs(kinds=[JobKind.TRAIN])  # as the page lists them: rows without their configs
    modes = run_modes(orch, listed)
    assert sorted(r.name for r in offered_runs(listed, modes)) == ["my dpo", "my grpo"]
    assert [r.name for r in offered_runs(listed, modes, "transcribe")] == ["my stt"]
    assert [r.name for r in offered_runs(listed, modes, "speak")] == ["my tts"]


@pytest.mark.parametrize("method, field, words", [
    ("reward", "source", ("cannot be evaluated by its answers", "pair accuracy")),
    ("stt", "metrics", ("scored by its transcripts", "choose metrics [wer, cer]")),
    ("tts", "source", ("cannot be evaluated by its answers, nor by wer/cer", "eval loss", "charted during training",
                       "Playground's Text to speech mode"))])
def test_an_eval_by_answers_of_a_model_that_writes_none_is_refused_naming_what_fits(runs, tmp_path, method, field,
                                                                                   words):
    from trainer_core.evaluation.spec import EvalSpec

    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"instruction": "Say hi", "output": "hi"}) + "\n")
    problems = [e for e in EvalSpec(source=ModelSource(run_id=RUNS[method]), data=str(data),
                                    metrics=["exact"]).validate() if e.field == field]
    assert len(problems) == 1 and all(w in problems[0].message for w in words), problems
    assert not [e for e in EvalSpec(source=ModelSource(run_id=RUNS["dpo"]), data=str(data),
                                    metrics=["exact"]).validate() if e.field in ("source", "metrics")]


@pytest.mark.parametrize("metrics", [["wer"], ["wer", "cer"], ["exact", "rouge"]])
def test_a_text_to_speech_run_is_refused_for_every_eval_once_naming_what_fits(runs, tmp_path, metrics):
    from trainer_core.evaluation.spec import EvalSpec

    data = tmp_path / "clips.jsonl"
    data.write_text(json.dumps({"audio": "a.wav", "text": "hi"}) + "\n")
    problems = [(e.field, e.message) for e in EvalSpec(source=ModelSource(run_id=RUNS["tts"]), data=str(data),
                                                       metrics=metrics).validate()
                if e.field in ("source", "metrics", "lm_eval_tasks")]
    assert len(problems) == 1 and problems[0][0] == "source", problems  # not also "this model writes text"
    assert problems[0][1].startswith("my tts · final was trained with Text-to-speech (CSM) · Full fine-tuning, so it "
                                     "cannot be evaluated by its answers, nor by wer/cer"), problems


def test_vllm_is_not_offered_for_a_model_it_cannot_serve(runs):
    assert vllm_fits([resolve(ModelSource(run_id=RUNS["tts"]))]) == "vLLM serves models that write answers"
    assert vllm_fits([resolve(ModelSource(run_id=RUNS["dpo"]))]) == ""


def test_a_text_to_speech_runs_weights_swapped_for_a_link_out_of_the_run_are_not_exported_nor_served(runs, tmp_path):
    """Hostile: the run's model/ replaced by a symlink to another CSM folder; export and serve refuse the source."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text(json.dumps({"model_type": "csm"}))
    weights = paths.run_dir(RUNS["tts"]) / "model"
    for item in weights.iterdir():
        item.unlink()
    weights.rmdir()
    weights.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(SourceError, match=r"its weights folder .* outside the job's folder"):
        resolve(ModelSource(run_id=RUNS["tts"]))
    source = ModelSource(run_id=RUNS["tts"])
    for spec in (ExportSpec(source=source, targets=["merged"]),
                 ServeSpec(source=source, sources=[source], api_key_hash="0" * 64)):
        problems = [e for e in spec.validate() if e.field == "run"]
        assert len(problems) == 1 and "outside the job's folder" in problems[0].message, spec.validate()
