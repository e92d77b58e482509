"""Stop & save, resume and db rebuild for the runs that are not chat text (issues 20, 21, 22): an embedding model
(sentence-transformers' trainer), a Whisper model (Seq2SeqTrainer), a CSM text-to-speech model (a Trainer on cached
codec frames) and a vision-language model (TRL on the processor), each on its tiny model through the orchestrator. The lifecycle is generic (every trainer is a
transformers.Trainer); this proves it for each: the checkpoint Stop leaves, the step count resumed from it with
no step lost or repeated, and every metric key restored by a rebuild."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.data_rows import jargon
from tests.methods.test_method_lifecycle import stop_resume_rebuild
from tests.support.speech import ESPEAK, NO_ESPEAK, build_tiny_csm, build_tiny_whisper, spoken_rows
from tests.support.vision import build_tiny_vlm, shape_rows
from tests.support.data_rows import write_jsonl as write_rows
from trainer_core.methods.embedding import EmbeddingSettings
from trainer_core.methods.stt import SttSettings
from trainer_core.methods.tts import TtsSettings
from trainer_core.config import TrainConfig
from trainer_core.methods.embedding import BUNDLED_MODEL as MINILM

pytestmark = [pytest.mark.train, pytest.mark.subprocess]

STEPS = 24  # far more than the steps before Stop: the run is still training when the request arrives
COMMON = dict(max_steps=STEPS, warmup_steps=0, logging_steps=1, save_steps=0, random_seed=0)


def embedding_config(tmp_path: Path) -> TrainConfig:
    train, _ = jargon()
    data = write_rows(tmp_path / "pairs.jsonl", train)
    return TrainConfig(run_name="lifecycle embedding", method="embedding", adapter="full", model_name=MINILM,
                       local_datasets=[str(data)], batch_size=8, learning_rate=1e-4, max_seq_length=64,
                       method_settings=EmbeddingSettings(ir_holdout=0.0, eval_on_start=False,
                                                         columns={"anchor": "question", "positive": "passage"}),
                       **COMMON)


def speech_config(tmp_path: Path) -> TrainConfig:
    if ESPEAK is None:
        pytest.skip(NO_ESPEAK)
    data = write_rows(tmp_path / "speech" / "train.jsonl", spoken_rows(tmp_path / "speech"))
    return TrainConfig(run_name="lifecycle speech", method="stt", adapter="full", model_name=str(build_tiny_whisper()),
                       local_datasets=[str(data)], batch_size=4, learning_rate=1e-3,
                       method_settings=SttSettings(language="en"),
                       **COMMON)


def tts_config(tmp_path: Path) -> TrainConfig:
    if ESPEAK is None:
        pytest.skip(NO_ESPEAK)
    data = write_rows(tmp_path / "speech" / "train.jsonl", spoken_rows(tmp_path / "speech"))
    # a step takes milliseconds: many steps, so the run is still training when Stop arrives
    return TrainConfig(run_name="lifecycle tts", method="tts", adapter="full", model_name=str(build_tiny_csm()),
                       local_datasets=[str(data)], batch_size=4, learning_rate=1e-3,
                       method_settings=TtsSettings(sample_texts=["hi"], max_sample_s=1.0),
                       **{**COMMON, "max_steps": 400})


def vision_config(tmp_path: Path) -> TrainConfig:
    folder = tmp_path / "shapes"
    data = write_rows(folder / "train.jsonl", shape_rows(folder, 32, seed=1, prefix="train"))
    return TrainConfig(run_name="lifecycle vision", model_name=str(build_tiny_vlm()), local_datasets=[str(data)],
                       batch_size=4, learning_rate=1e-3, max_seq_length=64, lora_r=8, lora_alpha=16,
                       target_modules=[], **COMMON)


CONFIGS = {"embedding": embedding_config, "stt": speech_config, "tts": tts_config, "vision": vision_config}


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_stop_saves_resume_continues_and_rebuild_restores_every_metric(kind, studio, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = CONFIGS[kind](tmp_path)
    run_dir = stop_resume_rebuild(studio, cfg, "loss", cfg.max_steps, every_key=True)
    if kind == "tts":  # the resumed run read every clip's frames from the cache the first run filled
        logs = {d.name: (d / "worker.log").read_text() for d in run_dir.parent.iterdir() if (d / "worker.log").exists()}
        first = logs.pop(run_dir.name)
        [resumed] = logs.values()
        assert "Codec frames: 12 clips, 0 from the cache, 12 encoded" in first
        assert "Codec frames: 12 clips, 12 from the cache, 0 encoded" in resumed
