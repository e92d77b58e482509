"""A GRPO run whose reward misbehaves (issue 31): the run's error names the reward, the fault and the fix, instead
of "too many dimensions 'str'" or a run that "completed" after learning nothing from inf scores; a few non-finite
scores are a warning and training goes on. The guard's every case is unit-tested in tests/rewards/test_reward_guard.py;
this proves the worker wires it into TRL's GRPOTrainer and reports it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer_core.methods.grpo_settings import GRPOSettings
from trainer_core.config import TrainConfig
from trainer_core.protocol import events as ev, paths
from trainer_core.protocol.status import RunStatus

pytestmark = pytest.mark.train

REWARDS_PY = '''
def always_inf(prompts, completions, **_):
    return [float("inf")] * len(completions)


def first_inf(prompts, completions, **_):
    return [float("inf")] + [1.0] * (len(completions) - 1)


def words(prompts, completions, **_):
    return ["good"] * len(completions)
'''


def config(tiny_model: Path, tmp_path: Path, function: str) -> TrainConfig:
    (tmp_path / "mine.py").write_text(REWARDS_PY)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"Say {word}."}) + "\n" for word in ("yes", "no", "maybe", "so")))
    return TrainConfig(run_name=f"grpo {function}", model_name=str(tiny_model), method="grpo", max_steps=2,
                       batch_size=2, max_seq_length=128, warmup_steps=0, logging_steps=1, save_steps=0,
                       learning_rate=1e-3, local_datasets=[str(train)], eval_fraction=0.0,
                       method_settings=GRPOSettings(
                           num_generations=2, max_completion_length=8, max_prompt_length=96, sample_every=0,
                           rewards=[{"python": str(tmp_path / "mine.py"), "function": function},
                                    {"type": "length", "target": 4}]))


@pytest.mark.parametrize("function,error", [
    ("always_inf", "RewardError: reward 'always_inf' returned non-finite scores (NaN or inf) for 2 of its 2 scores so "
                   "far, more than half: make it return finite floats (None for a completion it does not score)"),
    ("words", "RewardError: reward 'words' returned a str ('good') for completion 0: each score is a float, or None "
              "for a completion it does not score"),
])
def test_a_misbehaving_reward_fails_the_run_naming_it(studio, tiny_model, tmp_path, function, error):
    run_id = studio.start(config(tiny_model, tmp_path, function))
    snap = studio.wait(run_id, timeout=300)
    assert snap.status is RunStatus.FAILED, studio.log_tail(run_id, 60)
    assert snap.error == error


def test_a_few_non_finite_scores_are_a_warning_and_training_goes_on(studio, tiny_model, tmp_path):
    run_id = studio.start(config(tiny_model, tmp_path, "first_inf"))
    snap = studio.wait(run_id, timeout=300)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 60)}"
    events, _ = ev.read_new(paths.run_dir(run_id) / ev.LOG_NAME, 0)
    warnings = [e.message for e in events if isinstance(e, ev.WarningEvent) and "first_inf" in e.message]
    assert warnings == ["reward 'first_inf' returned inf for 1 of 2 completions at step 1: those scores are left out "
                        "(as None) and training goes on; past half of its scores the run stops. Make it return finite "
                        "floats (None for a completion it does not score)."]
