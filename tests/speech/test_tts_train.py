"""Text-to-speech end to end, through the orchestrator and a real worker: a tiny Sesame CSM (tests/support/speech.py)
trained on phrases espeak-ng speaks at several speeds and pitches, with two speaker ids. The eval split's loss is
measured before the first step (the base model's) and after training, and must fall; the spoken samples (WAV files
in the run folder, one SampleEvent each) are valid audio, and the tuned model ends its clip on its own at a length
near the recordings', where the base model talks until the cap."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import soundfile

from tests.support.speech import ESPEAK, NO_ESPEAK, PHRASES, build_tiny_csm, spoken_rows
from tests.support.data_rows import write_jsonl
from trainer_core.methods.tts import TtsSettings
from trainer_core.config import TrainConfig
from trainer_core.data import loading
from trainer_core.protocol.status import RunStatus

pytestmark = [pytest.mark.skipif(ESPEAK is None, reason=NO_ESPEAK)]

TRAIN_VARIANTS = ((175, 50), (150, 40), (200, 60), (165, 70))
EVAL_VARIANTS = ((185, 55),)


def tts_config(tmp_path: Path, **fields) -> TrainConfig:
    model = build_tiny_csm()
    data = tmp_path / "tts"
    rows = spoken_rows(data / "train", variants=TRAIN_VARIANTS)
    for i, row in enumerate(rows):
        row["speaker_id"] = i % 2  # two voices, named by a column the loader finds itself
    train = write_jsonl(data / "train" / "train.jsonl", rows)
    evals = write_jsonl(data / "eval" / "eval.jsonl", spoken_rows(data / "eval", variants=EVAL_VARIANTS))
    base = dict(run_name="tiny csm", model_name=str(model), method="tts", adapter="full",
                local_datasets=[str(train)], local_eval_datasets=[str(evals)],
                method_settings=TtsSettings(max_sample_s=4.0, sample_texts=[PHRASES[0]]),
                num_epochs=1, max_steps=120, batch_size=4, learning_rate=3e-3, warmup_steps=0, logging_steps=10,
                eval_steps=120, save_steps=0, lr_scheduler_type="constant")
    return TrainConfig(**{**base, **fields})


@pytest.mark.train
@pytest.mark.subprocess
def test_csm_learns_to_speak_the_phrases_and_its_samples_are_wav_clips_of_plausible_length(studio, tmp_path):
    cfg = tts_config(tmp_path)
    assert cfg.validate() == [] and loading.check_data(cfg) == []
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 80)}"

    frame = studio.metrics(run_id, keys=["eval_loss", "loss"])
    evals = frame.dropna(subset=["eval_loss"]).sort_values("step")
    assert list(evals["step"]) == [0, 120], evals  # the base model's at step 0 (eval_on_start), the tuned one's
    before, after = float(evals["eval_loss"].iloc[0]), float(evals["eval_loss"].iloc[-1])
    losses = frame.dropna(subset=["loss"]).sort_values("step")["loss"]
    print(f"eval loss {before:.3f} -> {after:.3f}; train loss {losses.iloc[0]:.3f} -> {losses.iloc[-1]:.3f}")
    assert math.isfinite(before) and after < before - 0.5, (before, after)
    assert losses.iloc[-1] < losses.iloc[0]

    run_dir = Path(studio.get_run(run_id).output_dir).parent
    samples = {s.step: s for s in studio.samples(run_id)}
    assert sorted(samples) == [0, 120], samples
    recordings = [soundfile.info(str(p)).duration for p in (tmp_path / "tts" / "train").glob("clip-0-*.wav")]
    lengths = {}
    for step, sample in samples.items():
        assert sample.audio == f"samples/step-{step:06d}-0.wav" and sample.prompt == PHRASES[0]
        info = soundfile.info(str(run_dir / sample.audio))
        assert info.samplerate == 24000 and info.channels == 1 and info.format == "WAV"
        lengths[step] = info.duration
    print(f"spoken '{PHRASES[0]}': base {lengths[0]:.2f} s {samples[0].flags}, tuned {lengths[120]:.2f} s; "
          f"recordings {min(recordings):.2f}-{max(recordings):.2f} s")
    assert "no_end" in samples[0].flags  # the untrained model does not know when to stop
    assert not samples[120].flags, samples[120].flags
    assert 0.5 * min(recordings) <= lengths[120] <= 1.5 * max(recordings), (lengths, recordings)
