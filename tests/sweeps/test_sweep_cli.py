"""`python -m trainer_core sweep`: a sweep from a YAML file, driven and followed to its end by the CLI (fake trials)."""
from __future__ import annotations

import pytest

from trainer_core.__main__ import main as cli
from trainer_core.cli import sweep as cli_sweep
from trainer_core.jobs import orchestrator
from trainer_core.sweeps import record

SWEEP_YAML = """\
model_name: {model}
max_steps: 10
eval_fraction: 0.2
eval_steps: 5
sweep:
  search: grid
  params:
    learning_rate: [1e-5, 1e-3]
  pruner: none
"""


@pytest.fixture
def cli_home(home, fake_launcher, monkeypatch):
    monkeypatch.setattr(orchestrator, "PlacingLauncher", lambda: fake_launcher)
    monkeypatch.setattr(cli_sweep, "FOLLOW_EVERY_S", 0.05)
    for name, value in (("LOSSES", "lr"), ("STEPS", "10"), ("EVAL_EVERY", "5"), ("DELAY", "0")):
        monkeypatch.setenv(f"FAKE_{name}", value)
    return home


def test_sweep_runs_from_yaml_and_prints_the_best_trial(cli_home, tmp_path, capsys):
    from trainer_core.config import BUNDLED_MODEL

    config = tmp_path / "sweep.yaml"
    config.write_text(SWEEP_YAML.format(model=BUNDLED_MODEL))
    assert cli(["sweep", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    (sweep_id,) = record.list_ids()
    last = [line for line in out.splitlines() if line.startswith(f"sweep {sweep_id} completed")]
    assert last == [f"sweep {sweep_id} completed: 2 completed; best: trial {_trial_of(out, '0.001')} eval_loss 1.1 "
                    "learning_rate=0.001"]
    assert cli(["sweep", "show", sweep_id]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == last[0] and sum("*best*" in line for line in shown) == 1
    assert cli(["sweep", "list"]) == 0
    assert capsys.readouterr().out.startswith(f"{sweep_id}  completed  grid    learning_rate  eval_loss (minimize)")


def _trial_of(out: str, lr: str) -> int:
    (line,) = [line for line in out.splitlines() if line.strip().startswith("trial") and f"learning_rate={lr}" in line]
    return int(line.split()[1])


def test_an_invalid_sweep_is_refused_with_every_problem(cli_home, tmp_path, capsys):
    config = tmp_path / "sweep.yaml"
    config.write_text("max_steps: 10\nsweep:\n  search: grid\n  n_trials: -1\n  params:\n"
                      "    learning_rate: {low: 0, high: 1e-3, log: true}\n")
    assert cli(["sweep", "--config", str(config)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: sweep.params.learning_rate.low: a log scale cannot reach zero or below: set low above 0 (e.g. 1e-06) or "
        "drop log",
        "error: sweep.n_trials: cannot be negative (0: the whole grid, or until timeout_minutes)",
        "error: sweep.objective: eval_loss needs an eval set: set eval_fraction (e.g. 0.1), local_eval_datasets or "
        "eval_split in the base config"]
    assert record.list_ids() == []
