"""A real sweep: three trials on the bundled SmolLM2 with LoRA, a few steps each, over learning rates two decades
apart (1e-5 learns nothing in the six steps given, 1e-3 clearly does) and one that diverges (1.0)."""
from __future__ import annotations

import pytest
from optuna.trial import TrialState

from tests.support import wait_until
from trainer_core.config import BUNDLED_MODEL
from trainer_core.protocol.status import RunStatus
from trainer_core.sweeps import checks, record
from trainer_core.sweeps.driver import PRUNED, open_study
from trainer_core.sweeps.record import SweepStatus
from trainer_core.sweeps.runner import SweepRunner

pytestmark = pytest.mark.train

STEPS = 6
SMALL, GOOD, DIVERGING = 1e-5, 1e-3, 1.0


@pytest.mark.timeout(1800)  # three model loads: minutes on a 2-core machine that other jobs also load
def test_a_learning_rate_sweep_picks_the_good_region_and_prunes_the_diverging_trial(studio):
    runner = SweepRunner(studio, tick_s=0.2)  # a short tick: the diverging trial is caught within a step or two
    studio.add_closer(runner.close)
    config, errors = checks.read({
        "model_name": BUNDLED_MODEL, "max_steps": STEPS, "batch_size": 2, "max_seq_length": 64, "warmup_steps": 0,
        "logging_steps": 1, "eval_fraction": 0.02, "eval_steps": 3,
        "sweep": {"name": "lr", "search": "grid", "params": {"learning_rate": [SMALL, GOOD, DIVERGING]},
                  "pruner": "none"}})
    assert errors == []
    sweep_id = runner.create(config)
    wait_until(lambda: record.read(sweep_id).status is SweepStatus.COMPLETED, timeout=1800,  # a safety net only
               what="the sweep to complete")

    study = open_study(record.sweep_dir(sweep_id), config.spec)
    by_lr = {t.params["learning_rate"]: t for t in study.trials}
    runs = {r.sweep_trial: r for r in studio.store.sweep_runs(sweep_id)}
    assert study.best_trial.params == {"learning_rate": GOOD}
    small, good = by_lr[SMALL], by_lr[GOOD]
    assert (small.state, good.state) == (TrialState.COMPLETE, TrialState.COMPLETE)
    assert sorted(good.intermediate_values) == [3, 6]
    # 1e-5 does not learn in six steps: its eval loss barely moves; 1e-3 ends far below it
    assert abs(small.intermediate_values[6] - small.intermediate_values[3]) < 0.05 * small.intermediate_values[3]
    assert good.value < 0.8 * small.value
    diverged = by_lr[DIVERGING]
    run = runs[diverged.number]
    assert diverged.state is TrialState.PRUNED, (diverged.state, studio.log_tail(run.id))
    assert diverged.user_attrs[PRUNED].startswith("train loss ") or "not finite" in diverged.user_attrs[PRUNED]
    assert run.status is RunStatus.STOPPED and run.steps_done < STEPS  # stopped and saved before its last step
    assert len(runs) == 3 and {runs[t.number].status for t in (small, good)} == {RunStatus.COMPLETED}
