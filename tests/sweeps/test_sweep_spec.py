"""The sweep: section read and checked before anything starts: each problem names its field and the fix."""
from __future__ import annotations

import pytest

from trainer_core.config import FieldError, TrainConfig
from trainer_core.sweeps import checks
from trainer_core.sweeps.spec import apply, grid_points

BASE = {"max_steps": 20, "eval_fraction": 0.1, "eval_steps": 5}
LR = {"low": 1e-5, "high": 1e-3, "log": True}


def errors_of(sweep, base=BASE) -> list[FieldError]:
    return checks.read({**base, "sweep": sweep})[1]


@pytest.mark.parametrize("sweep, expected", [
    ({"params": {"learning_rate": {"low": 1e-3, "high": 1e-5}}},
     [FieldError("sweep.params.learning_rate", "the range is empty: low (0.001) must be below high (1e-05)")]),
    ({"params": {"learning_rate": {"low": 0, "high": 1e-3, "log": True}}},
     [FieldError("sweep.params.learning_rate.low", "a log scale cannot reach zero or below: set low above 0 (e.g. "
                                                   "1e-06) or drop log")]),
    ({"params": {"learning_rate": {"values": []}}},
     [FieldError("sweep.params.learning_rate", "the range is empty: give values: [...] or both low and high")]),
    ({"params": {"learning_rate": LR}, "n_trials": 0},
     [FieldError("sweep.n_trials", "the budget cannot run one trial: set n_trials to 1 or more, or a timeout_minutes "
                                   "above 0")]),
    ({"params": {"learning_rate": LR}, "objective": "rewards/accuracies"},
     [FieldError("sweep.objective", "method sft does not log 'rewards/accuracies': choose one of eval_loss")]),
    ({"search": "grid", "params": {"learning_rate": LR}},
     [FieldError("sweep.params.learning_rate", "a grid search needs a finite set: give values, a step, or "
                                               "grid_points for this range")]),
    ({"params": {"lora_rr": [8, 16]}},
     [FieldError("sweep.params.lora_rr", "at 8: lora_rr: unknown field. Did you mean 'lora_r'?")]),
    ({"params": {"lora_r": [8, -1]}},
     [FieldError("sweep.params.lora_r", "at -1: lora_r: use a rank such as 8, 16 or 64 (got -1)")]),
    ({"serach": "grid", "params": {"learning_rate": LR}},
     [FieldError("sweep.serach", "unknown sweep setting; did you mean search?")]),
    ({"search": "bayes", "params": {}, "parallel": 0},
     [FieldError("sweep.search", "unknown search 'bayes': choose one of grid, random, tpe"),
      FieldError("sweep.params", "name at least one setting to search, e.g. learning_rate: {low: 1e-5, high: 1e-3, "
                                 "log: true}"),
      FieldError("sweep.parallel", "at least 1 trial must run at a time")]),
])
def test_each_problem_names_its_field_and_fix(sweep, expected):
    assert errors_of(sweep) == expected


def test_an_objective_needs_an_eval_set_that_reports_within_a_trial():
    assert errors_of({"params": {"learning_rate": LR}}, {"max_steps": 20}) == [
        FieldError("sweep.objective", "eval_loss needs an eval set: set eval_fraction (e.g. 0.1), local_eval_datasets "
                                      "or eval_split in the base config")]
    assert errors_of({"params": {"learning_rate": LR}}, {**BASE, "eval_steps": 50}) == [
        FieldError("eval_steps", "evaluates every 50 steps but a trial runs 20: set eval_steps to max_steps or less so "
                                 "each trial reports its objective")]


def test_a_file_without_a_sweep_section_is_refused():
    assert checks.read(BASE)[1] == [
        FieldError("sweep", "the file has no sweep: section (search, params, n_trials, objective)")]


def test_yaml_exponents_without_a_dot_are_numbers_and_a_good_sweep_has_no_problems():
    config, errors = checks.read({**BASE, "sweep": {"params": {
        "learning_rate": {"low": "1e-5", "high": "1e-3", "log": True}, "lora_r": [8, 16]}}})
    assert errors == []
    assert (config.spec.params[0].low, config.spec.params[0].high) == (1e-5, 1e-3)
    assert config.spec.trial_budget() == 10 and config.spec.search == "tpe"


def test_grid_points_and_budget():
    config, errors = checks.read({**BASE, "sweep": {"search": "grid", "params": {
        "learning_rate": {"low": 1e-5, "high": 1e-3, "log": True, "grid_points": 3},
        "lora_r": {"low": 8, "high": 32, "step": 8}}}})
    assert errors == []
    assert [p.grid() for p in config.spec.params] == [[1e-05, 0.0001, 0.001], [8, 16, 24, 32]]
    assert config.spec.trial_budget() == 12 and config.spec.trial_budget(5) == 5 and config.spec.trial_budget(20) == 12
    assert grid_points(config.spec)[:2] == [{"learning_rate": 1e-05, "lora_r": 8}, {"learning_rate": 1e-05, "lora_r": 16}]


def test_dotted_settings_go_into_their_method_section():
    base = {**BASE, "method": "dpo", "dpo": {"loss_type": "sigmoid"}}
    data = apply(base, {"dpo.beta": 0.3, "learning_rate": 5e-5})
    assert data["dpo"] == {"loss_type": "sigmoid", "beta": 0.3} and base["dpo"] == {"loss_type": "sigmoid"}
    cfg = TrainConfig.from_dict(data)
    assert cfg.learning_rate == 5e-5 and cfg.method_settings.beta == 0.3
