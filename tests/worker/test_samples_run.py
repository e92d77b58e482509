"""Samples during training, for real: a tiny model trains a few steps and its sample answers reach the store."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trainer_core.evaluation import samples_check
from trainer_core.config import TrainConfig
from trainer_core.protocol import events as ev
from trainer_core.protocol.status import RunStatus

pytestmark = pytest.mark.train


def test_sample_answers_of_a_real_run_reach_the_store(studio, tiny_model):
    cfg = TrainConfig(run_name="samples", model_name=str(tiny_model), max_steps=4, batch_size=2, max_seq_length=64,
                      warmup_steps=0, save_steps=2, sample_prompts=["What is the capital of France?", "Say hi."],
                      sample_max_new_tokens=8)
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=300)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 100)}"

    samples = studio.samples(run_id)
    # no eval set: at each checkpoint save (steps 2 and 4); the end (step 4) is not sampled twice
    assert [(s.step, s.index) for s in samples] == [(4, 0), (4, 1), (2, 0), (2, 1)]
    assert [s.prompt for s in samples[:2]] == cfg.sample_prompts
    assert all(0 < s.new_tokens <= 8 and s.text for s in samples)
    assert all(s.flags == samples_check.check(s.text) for s in samples)  # the worker checked each answer
    # the store holds exactly what the worker logged
    logged, _ = ev.read_new(Path(studio.get_run(run_id).output_dir).parent / ev.LOG_NAME, 0)
    assert sorted((e.step, e.index, e.text) for e in logged if e.kind == "sample") == \
        sorted((s.step, s.index, s.text) for s in samples)
    assert "torch" not in sys.modules
