"""Speech-to-text end to end, through the orchestrator and a real worker: a tiny Whisper (tests/support/speech.py)
trained on phrases espeak-ng speaks at several speeds and pitches. The eval split (other recordings of the same
phrases) is transcribed before the first step (the base model's WER) and after training; the WER must fall far.
The saved folder reloads with its processor in a fresh interpreter and transcribes a clip."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.support.speech import ESPEAK, NO_ESPEAK, PHRASES, build_tiny_whisper, speak, spoken_rows
from tests.support.data_rows import write_jsonl
from tests.support import run_python, wait_for_step
from trainer_core.methods.stt import SttSettings
from trainer_core.config import TrainConfig
from trainer_core.data import loading
from trainer_core.protocol.status import RunStatus

pytestmark = [pytest.mark.skipif(ESPEAK is None, reason=NO_ESPEAK)]

TRAIN_VARIANTS = ((175, 50), (150, 40), (200, 60), (165, 70))
EVAL_VARIANTS = ((185, 55), (160, 45))

TRANSCRIBE = """
import sys
from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor
from trainer_core.worker.methods.stt import decode
folder, clip = sys.argv[1], sys.argv[2]
processor = AutoProcessor.from_pretrained(folder)
model = AutoModelForSpeechSeq2Seq.from_pretrained(folder).eval()
features = processor.feature_extractor(decode(clip, 16000), sampling_rate=16000, return_tensors="pt").input_features
ids = model.generate(features, language="en", task="transcribe", max_new_tokens=20)
print("TRANSCRIPT:" + processor.tokenizer.batch_decode(ids, skip_special_tokens=True)[0].strip())
"""


def speech_config(tmp_path: Path, **fields) -> TrainConfig:
    model = build_tiny_whisper()
    data = tmp_path / "speech"
    train = write_jsonl(data / "train" / "train.jsonl", spoken_rows(data / "train", variants=TRAIN_VARIANTS))
    # the eval set as an audio folder (the Hugging Face audiofolder convention: file_name + transcription)
    evals = data / "eval"
    write_jsonl(evals / "metadata.jsonl", [{"file_name": r["audio"], "transcription": r["text"]}
                                          for r in spoken_rows(evals, variants=EVAL_VARIANTS)])
    base = dict(run_name="tiny whisper", model_name=str(model), method="stt", adapter="full",
                local_datasets=[str(train)], local_eval_datasets=[str(evals)], method_settings=SttSettings(language="en"),
                num_epochs=1, max_steps=150, batch_size=4, learning_rate=3e-3, warmup_steps=0, logging_steps=10,
                eval_steps=150, save_steps=0, lr_scheduler_type="constant")
    return TrainConfig(**{**base, **fields})


@pytest.mark.train
@pytest.mark.subprocess
def test_whisper_trains_on_spoken_phrases_and_its_wer_falls_far_below_the_base_models(studio, tmp_path):
    cfg = speech_config(tmp_path)
    assert cfg.validate() == [] and loading.check_data(cfg) == []
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 80)}"

    frame = studio.metrics(run_id, keys=["eval_wer", "eval_cer"])
    wer = frame.dropna(subset=["eval_wer"]).sort_values("step")
    assert list(wer["step"]) == [0, 150], wer  # the base model's at step 0 (eval_on_start), the tuned one's at the end
    before, after = float(wer["eval_wer"].iloc[0]), float(wer["eval_wer"].iloc[-1])
    cer_before, cer_after = float(wer["eval_cer"].iloc[0]), float(wer["eval_cer"].iloc[-1])
    print(f"WER {before:.3f} -> {after:.3f}; CER {cer_before:.3f} -> {cer_after:.3f}")
    assert all(math.isfinite(v) for v in (before, after, cer_before, cer_after))
    assert before >= 0.9 and after <= 0.3, (before, after)  # an untrained decoder writes noise; the tuned one the words
    assert cer_after < cer_before

    output = Path(studio.get_run(run_id).output_dir)
    assert (output / "model.safetensors").is_file() and (output / "tokenizer_config.json").is_file()
    clip = speak(PHRASES[2], tmp_path / "fresh.wav", speed=170, pitch=52)  # a recording it has never heard
    result = run_python(TRANSCRIBE, str(output), str(clip))
    assert result.returncode == 0, result.stderr[-3000:]
    transcript = result.stdout.split("TRANSCRIPT:")[-1].strip()
    print("transcript of a fresh clip:", transcript)
    assert transcript == PHRASES[2]


LOAD_ADAPTER = """
import sys
from peft import PeftModel
from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor
from trainer_core.worker.methods.stt import decode
base, adapter, clip = sys.argv[1], sys.argv[2], sys.argv[3]
processor = AutoProcessor.from_pretrained(adapter)  # the run saved the processor beside the adapter
model = PeftModel.from_pretrained(AutoModelForSpeechSeq2Seq.from_pretrained(base), adapter).eval()
features = processor.feature_extractor(decode(clip, 16000), sampling_rate=16000, return_tensors="pt").input_features
ids = model.generate(input_features=features, language="en", task="transcribe", max_new_tokens=20)
adapted = {name.split(".lora_A")[0].split(".")[-1] for name, _ in model.named_parameters() if ".lora_A" in name}
print("ADAPTED:" + ",".join(sorted(adapted)))
print("TRANSCRIPT:" + processor.tokenizer.batch_decode(ids, skip_special_tokens=True)[0].strip())
"""


@pytest.mark.train
@pytest.mark.subprocess
def test_a_lora_run_saves_an_adapter_on_q_and_v_that_loads_onto_its_base_with_the_processor(studio, tmp_path):
    cfg = speech_config(tmp_path, adapter="lora", max_steps=4, eval_steps=4, lora_r=4, lora_alpha=8)
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 80)}"
    wer = studio.metrics(run_id, keys=["eval_wer"]).dropna(subset=["eval_wer"])
    assert list(wer["step"]) == [0, 4]
    output = Path(studio.get_run(run_id).output_dir)
    assert output.name == "adapter" and (output / "adapter_model.safetensors").is_file()
    clip = speak(PHRASES[0], tmp_path / "fresh.wav")
    result = run_python(LOAD_ADAPTER, str(cfg.model_name), str(output), str(clip))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ADAPTED:" + "q_proj,v_proj" in result.stdout  # stt.lora_target_modules' default
    assert "TRANSCRIPT:" in result.stdout


@pytest.mark.train
def test_stop_and_save_then_resume_continues_the_step_count(studio, tmp_path):
    cfg = speech_config(tmp_path, max_steps=200, eval_steps=1000)
    old = studio.start(cfg)
    wait_for_step(studio, old, 4)
    studio.stop(old)
    assert studio.wait(old, timeout=120).status is RunStatus.STOPPED
    run_dir = Path(studio.get_run(old).output_dir).parent
    assert (run_dir / "model" / "model.safetensors").is_file()  # Stop & save writes the model with its processor
    assert (run_dir / "model" / "processor_config.json").is_file()
    checkpoint = next((run_dir / "checkpoints").glob("checkpoint-*"))
    stopped_at = int(checkpoint.name.split("-")[1])
    assert {"optimizer.pt", "scheduler.pt", "trainer_state.json"} <= {p.name for p in checkpoint.iterdir()}

    new = studio.resume(old)
    snap = studio.wait(new, timeout=300)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(new, 80)}"
    own = studio.metrics(new).dropna(subset=["loss"])
    assert own["step"].iloc[0] > stopped_at and own["step"].iloc[-1] == 200
    assert studio.get_run(new).steps_done == 200
