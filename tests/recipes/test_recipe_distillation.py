"""Distillation through a data recipe, for real: a folder of documents about invented places becomes Q&A rows through
the documents starter and a deterministic teacher (tests/support/fake_teacher.py); the bundled SmolLM2 trained on the
recipe's dataset (picked by its path, as New run's picker gives it) then answers held-out questions about those
documents, phrased as it never saw them, better than the base model does: an eval job with its baseline says so."""
from __future__ import annotations

import json
import sys

import pytest

from tests.support import wait_until
from tests.support.fake_teacher import FakeTeacher, fact_files, fact_sentence
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.protocol.status import RunStatus
from trainer_core.recipes import launch, starters, store
from trainer_core.specs.model_source import ModelSource

pytestmark = pytest.mark.train

FACTS = 16
TRAIN = {"run_name": "distilled gazetteer", "model_name": BUNDLED_MODEL, "method": "sft", "adapter": "lora",
         "max_steps": 32, "batch_size": 2, "learning_rate": 2e-3, "warmup_steps": 2, "lora_r": 16, "lora_alpha": 32,
         "max_seq_length": 128, "format_type": "auto"}


@pytest.mark.timeout(3600)  # a recipe, a training and two eval jobs, on a machine that may be loaded
def test_a_model_trained_on_a_recipe_answers_questions_about_its_documents(studio, tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", "1")  # the teacher listens on loopback
    chosen = fact_files(tmp_path / "docs", FACTS)
    with FakeTeacher() as teacher:
        spec = launch.from_fields({**starters.spec_fields("docs-qa"), "documents": str(tmp_path / "docs"),
                                   "num_rows": FACTS, "batch_size": 8, "dataset_name": "gazetteer",
                                   "models": [{"alias": "teacher", "url": teacher.url, "model": "teacher"}]})
        job_id = launch.start(studio, spec)
        wait_until(lambda: studio.get_run(job_id).status.is_terminal(), timeout=600, what="the recipe job")
    assert studio.get_run(job_id).status is RunStatus.COMPLETED, studio.get_run(job_id).error
    (version,) = store.published()
    assert version.card["kept"] == FACTS

    cfg = TrainConfig(**TRAIN, local_datasets=[version.ref])
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=2400)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 200)}"
    assert studio.get_run(run_id).dataset == "gazetteer@v1"  # History finds the run by its recipe dataset

    held_out = tmp_path / "held_out.jsonl"  # asked as the training rows never were
    held_out.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"Tell me the {attribute} of {entity}."},
        {"role": "assistant", "content": fact_sentence(attribute, entity, value)}]}) + "\n"
        for attribute, entity, value in chosen))
    eval_spec = EvalSpec(source=ModelSource(run_id=run_id), data=str(held_out), metrics=["exact", "rouge"],
                         max_samples=FACTS, max_new_tokens=14, batch_size=8)
    eval_id, baseline_id = studio.start_eval(eval_spec)
    assert baseline_id is not None
    for job in (eval_id, baseline_id):
        snap = studio.wait(job, timeout=1200)
        assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(job, 60)}"
    tuned, base = studio.eval_result(eval_id).metrics, studio.eval_result(baseline_id).metrics
    print({"base": base, "tuned": tuned})  # the figures docs/data-recipes.md quotes
    assert base["exact"] <= 0.05  # no model knows these places
    # the answer's frame ("The capital of X is") comes with the question; the invented value only from training
    assert tuned["rouge_l"] >= base["rouge_l"] + 0.2
    assert tuned["exact"] > base["exact"]
    assert "torch" not in sys.modules  # the dashboard side of the test never imported the ML stack
