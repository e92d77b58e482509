"""Stop & save, resume and db rebuild for the runs that are not chat text (issues 20, 21, 22): an embedding model
(sentence-transformers' trainer), a Whisper model (Seq2SeqTrainer) and a vision-language model (TRL on the
processor), each on its tiny model through the orchestrator. The lifecycle is generic (every trainer is a
transformers.Trainer); this proves it for each: the checkpoint Stop leaves, the step count resumed from it with
no step lost or repeated, and every metric key restored by a rebuild."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from db.store import Store
from tests.methods.test_embedding_train import jargon
from tests.speech_support import ESPEAK, NO_ESPEAK, build_tiny_whisper, spoken_rows
from tests.support import wait_for_step
from tests.vision_support import build_tiny_vlm, shape_rows
from tests.vision_support import write_jsonl as write_rows
from trainer_core.config import TrainConfig
from trainer_core.jobs import rebuild
from trainer_core.methods.embedding import BUNDLED_MODEL as MINILM
from trainer_core.protocol.status import RunStatus

pytestmark = [pytest.mark.train, pytest.mark.subprocess]

STEPS = 24  # far more than the steps before Stop: the run is still training when the request arrives
COMMON = dict(max_steps=STEPS, warmup_steps=0, logging_steps=1, save_steps=0, random_seed=0)


def embedding_config(tmp_path: Path) -> TrainConfig:
    train, _ = jargon()
    data = write_rows(tmp_path / "pairs.jsonl", train)
    return TrainConfig(run_name="lifecycle embedding", method="embedding", adapter="full", model_name=MINILM,
                       local_datasets=[str(data)], batch_size=8, learning_rate=1e-4, max_seq_length=64,
                       embedding={"ir_holdout": 0.0, "eval_on_start": False, "columns": {"anchor": "question",
                                                                                           "positive": "passage"}},
                       **COMMON)


def speech_config(tmp_path: Path) -> TrainConfig:
    if ESPEAK is None:
        pytest.skip(NO_ESPEAK)
    data = write_rows(tmp_path / "speech" / "train.jsonl", spoken_rows(tmp_path / "speech"))
    return TrainConfig(run_name="lifecycle speech", method="stt", adapter="full", model_name=str(build_tiny_whisper()),
                       local_datasets=[str(data)], batch_size=4, learning_rate=1e-3, stt={"language": "en"},
                       **COMMON)


def vision_config(tmp_path: Path) -> TrainConfig:
    folder = tmp_path / "shapes"
    data = write_rows(folder / "train.jsonl", shape_rows(folder, 32, seed=1, prefix="train"))
    return TrainConfig(run_name="lifecycle vision", model_name=str(build_tiny_vlm()), local_datasets=[str(data)],
                       batch_size=4, learning_rate=1e-3, max_seq_length=64, lora_r=8, lora_alpha=16,
                       target_modules=[], **COMMON)


CONFIGS = {"embedding": embedding_config, "stt": speech_config, "vision": vision_config}


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_stop_saves_resume_continues_and_rebuild_restores_every_metric(kind, studio, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    old = studio.start(CONFIGS[kind](tmp_path))
    wait_for_step(studio, old, 2)
    studio.stop(old)
    snap = studio.wait(old, timeout=300)
    assert snap.status is RunStatus.STOPPED, f"{snap.error}\n{studio.log_tail(old, 60)}"
    run_dir = Path(studio.get_run(old).output_dir).parent
    [checkpoint] = (run_dir / "checkpoints").glob("checkpoint-*")
    stopped_at = int(checkpoint.name.split("-")[1])
    assert 2 <= stopped_at < STEPS

    new = studio.resume(old)
    snap = studio.wait(new, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(new, 60)}"
    own = studio.metrics(new, keys=["loss"]).dropna(subset=["loss"])
    assert list(own["step"]) == list(range(stopped_at + 1, STEPS + 1))  # the step count went on from the checkpoint
    joined = studio.metrics(new, lineage=True, keys=["loss"]).dropna(subset=["loss"])
    assert list(joined["step"]) == list(range(1, STEPS + 1))  # no step lost or duplicated across the two runs

    keys = {run: studio.metric_keys(run) for run in (old, new)}
    before = {run: studio.metrics(run, keys=["loss", *keys[run]]) for run in (old, new)}
    url = studio.store.url
    studio.close()
    report = rebuild.rebuild(url)
    assert sorted(report.runs) == sorted([old, new])
    store = Store(url)
    for run in (old, new):
        assert store.metric_keys(run) == keys[run]
        pd.testing.assert_frame_equal(store.metrics_frame(run, keys=["loss", *keys[run]]), before[run])
    assert store.get_run(new).parent_run_id == old
    store.engine.dispose()
