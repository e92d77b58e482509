"""What a sweep decides from its trials' numbers: divergence, reports, values, pruning and the budget, with a fake
orchestrator (runs are records whose metrics the test writes) in place of workers."""
from __future__ import annotations

import math
import time

import pandas as pd
import pytest
from optuna.trial import TrialState

from db.entities import RunRecord
from trainer_core.config import BUNDLED_MODEL
from trainer_core.protocol.status import RunStatus
from trainer_core.sweeps import record
from trainer_core.sweeps.decisions import Row, divergence, final_value, new_reports
from trainer_core.sweeps.driver import PRUNED, SweepDriver
from trainer_core.sweeps.record import SweepStatus
from trainer_core.sweeps import checks


def test_divergence_names_the_step_and_the_reason():
    rows = [Row(1, 2.0, None), Row(2, 5.0, None), Row(3, 8.5, None)]
    assert divergence(rows, 4.0, "eval_loss") == "train loss 8.5 at step 3 is over 4x its first value 2"
    assert divergence(rows[:2], 4.0, "eval_loss") is None
    assert divergence([Row(1, 2.0, None), Row(2, None, None, ("loss",))], 4.0, "eval_loss") == \
        "loss was not finite at step 2"
    assert divergence([Row(5, 2.0, None, ("eval_loss",))], 4.0, "eval_loss") == "eval_loss was not finite at step 5"


def test_only_new_finite_evaluations_are_reported_and_the_last_is_the_value():
    rows = [Row(1, 2.0, None), Row(5, 1.5, 1.2), Row(10, 1.0, math.inf), Row(15, 1.0, 0.9)]
    assert new_reports(rows, reported=[5]) == [(15, 0.9)]
    assert final_value({5: 1.2, 15: 0.9}) == 0.9 and final_value({}) is None


class FakeStore:
    def __init__(self):
        self.runs: dict[str, RunRecord] = {}
        self.metrics: dict[str, list[dict]] = {}
        self.events: list[tuple[str, str, str]] = []

    def sweep_runs(self, sweep_id):
        return sorted((r for r in self.runs.values() if r.sweep_id == sweep_id), key=lambda r: r.created_at)

    def metrics_frame(self, run_id, from_step=None, columns=(), keys=None):
        rows = [r for r in self.metrics.get(run_id, []) if from_step is None or r["step"] >= from_step]
        return pd.DataFrame(rows, columns=["step", *columns, *(keys or [])])

    def add_event(self, run_id, kind, message):
        self.events.append((run_id, kind, message))


class FakeOrch:
    """Starts and stops runs as records; the test plays the workers by writing metrics and statuses."""

    def __init__(self):
        self.store = FakeStore()
        self.stopped: list[str] = []

    def start(self, cfg, actor=None, sweep=None):
        run_id = f"run{len(self.store.runs)}"
        self.store.runs[run_id] = RunRecord(id=run_id, status=RunStatus.RUNNING, created_at=time.time(),
                                            sweep_id=sweep[0], sweep_trial=sweep[1],
                                            config_json=str(cfg.learning_rate))
        return run_id

    def stop(self, run_id, actor=None):
        self.stopped.append(run_id)

    def play(self, run_id, evals: dict[int, float], losses=(2.0, 2.0), status=None):
        self.store.metrics[run_id] = [{"step": s, "loss": losses[min(s - 1, len(losses) - 1)], "nonfinite": "",
                                       "eval_loss": evals.get(s)} for s in range(1, max(evals) + 1)]
        if status is not None:
            self.store.runs[run_id] = self.store.runs[run_id].replace(status=status)


@pytest.fixture
def sweep(home):
    def make(**sweep) -> SweepDriver:
        config, errors = checks.read({"model_name": BUNDLED_MODEL, "max_steps": 10, "eval_fraction": 0.2,
                                                   "eval_steps": 5, "sweep": {"search": "grid", **sweep}})
        assert errors == []
        return SweepDriver(FakeOrch(), record.read(record.create(config, "ana", "operator")))
    return make


def test_the_median_pruner_stops_a_trial_worse_than_the_finished_one(sweep):
    driver = sweep(params={"learning_rate": [1e-3, 1e-5]}, parallel=2, pruner="median")
    orch = driver.orch
    assert driver.tick() is SweepStatus.RUNNING and sorted(orch.store.runs) == ["run0", "run1"]
    orch.play("run0", {5: 1.0, 10: 0.5}, status=RunStatus.COMPLETED)
    orch.play("run1", {5: 3.0})
    driver.tick()
    assert orch.stopped == ["run1"]
    trial = driver.study.trials[1]
    assert trial.user_attrs[PRUNED] == ("eval_loss 3 at step 5 is worse than the median pruner allows against the "
                                        "earlier trials")
    assert orch.store.events == [("run1", "sweep", f"pruned by sweep {driver.id}: {trial.user_attrs[PRUNED]}")]
    orch.play("run1", {5: 3.0}, status=RunStatus.STOPPED)  # it stopped and saved
    assert driver.tick() is SweepStatus.COMPLETED
    assert [(t.state, t.value) for t in driver.study.trials] == [(TrialState.COMPLETE, 0.5), (TrialState.PRUNED, 3.0)]
    assert orch.stopped == ["run1"]  # asked once


def test_a_diverging_trial_is_stopped_even_without_a_pruner(sweep):
    driver = sweep(params={"learning_rate": [1e-3]}, pruner="none")
    driver.tick()
    driver.orch.play("run0", {5: 1.0}, losses=(2.0, 3.0, 9.0))
    driver.tick()
    assert driver.orch.stopped == ["run0"]
    assert driver.study.trials[0].user_attrs[PRUNED] == "train loss 9 at step 3 is over 4x its first value 2"


def test_a_failed_run_fails_its_trial_and_the_sweep_goes_on(sweep):
    driver = sweep(params={"learning_rate": [1e-3, 1e-4]})
    driver.tick()
    driver.orch.store.runs["run0"] = driver.orch.store.runs["run0"].replace(status=RunStatus.FAILED,
                                                                            error="CUDA out of memory\ntrace")
    driver.tick()
    assert driver.study.trials[0].state is TrialState.FAIL
    assert driver.study.trials[0].user_attrs["error"] == "CUDA out of memory"
    assert sorted(driver.orch.store.runs) == ["run0", "run1"]


def test_a_completed_run_without_its_objective_fails_its_trial(sweep):
    driver = sweep(params={"learning_rate": [1e-3]})
    driver.tick()
    driver.orch.play("run0", {5: None}, status=RunStatus.COMPLETED)
    assert driver.tick() is SweepStatus.COMPLETED
    assert driver.study.trials[0].state is TrialState.FAIL
    assert driver.study.trials[0].user_attrs["error"] == "it reported no eval_loss"


def test_parallel_bounds_the_trials_under_way_and_the_budget_the_total(sweep):
    driver = sweep(params={"learning_rate": [1e-3, 1e-4, 1e-5]}, parallel=2, n_trials=2)
    driver.tick()
    driver.tick()
    assert sorted(driver.orch.store.runs) == ["run0", "run1"]
    for run_id in ("run0", "run1"):
        driver.orch.play(run_id, {5: 1.0, 10: 1.0}, status=RunStatus.COMPLETED)
    assert driver.tick() is SweepStatus.COMPLETED and len(driver.orch.store.runs) == 2
