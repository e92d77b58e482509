"""The sweep loop through the real orchestrator, pump and store, with tests/fake_worker.py as the trials' worker
(``FAKE_LOSSES=lr``: the eval loss depends on the trial's learning rate, best at 1e-3; 0.5 and above diverges).

The runner is ticked by the test (``start_thread=False``), and a trial that must be caught mid-run pauses at
``PAUSE_AT`` until the test releases it, so nothing here depends on how fast the machine is."""
from __future__ import annotations

from pathlib import Path

import pytest
from optuna.trial import TrialState

from tests.support import wait_until
from trainer_core.config import BUNDLED_MODEL
from trainer_core.jobs import rebuild
from trainer_core.protocol.status import RunStatus
from trainer_core.sweeps import record
from trainer_core.sweeps.driver import PAUSED, PRUNED, open_study
from trainer_core.sweeps.record import SweepStatus
from trainer_core.sweeps.runner import SweepRunner
from trainer_core.sweeps import checks
from trainer_core.sweeps.spec import SweepConfig

STEPS, EVERY, PAUSE_AT = 10, 5, 5
GOOD, SMALL, LARGE = 1e-3, 1e-5, 1e-1


@pytest.fixture
def release(tmp_path, monkeypatch) -> Path:
    """The fake trials: losses by learning rate; each pauses after step PAUSE_AT until the file
    ``release-<run id>`` exists in the returned folder."""
    markers = tmp_path / "markers"
    markers.mkdir()
    for name, value in (("LOSSES", "lr"), ("STEPS", str(STEPS)), ("EVAL_EVERY", str(EVERY)), ("DELAY", "0"),
                        ("PAUSE_AT", str(PAUSE_AT)), ("PAUSE_UNTIL", str(markers / "release-{run}"))):
        monkeypatch.setenv(f"FAKE_{name}", value)
    return markers


def let_go(markers: Path, run_id: str) -> None:
    (markers / f"release-{run_id}").touch()


def sweep_config(values: list[float], **sweep) -> SweepConfig:
    data = {"model_name": BUNDLED_MODEL, "max_steps": STEPS, "eval_fraction": 0.2, "eval_steps": EVERY,
            "sweep": {"search": "grid", "params": {"learning_rate": {"values": values}}, "n_trials": 0, **sweep}}
    config, errors = checks.read(data)
    assert errors == []
    return config


def trial_runs(orch, sweep_id: str) -> dict[int, list]:
    runs: dict[int, list] = {}
    for run in orch.store.sweep_runs(sweep_id):
        runs.setdefault(run.sweep_trial, []).append(run)
    return runs


def drive(runner: SweepRunner, orch, sweep_id: str, release: Path) -> None:
    """Tick the sweep; let each trial go on past PAUSE_AT only after the driver has seen its evaluation there."""
    def settled() -> bool:
        runner.tick_once()
        for run in orch.store.sweep_runs(sweep_id):
            if run.status.is_terminal():
                continue
            frame = orch.store.metrics_frame(run.id, columns=("eval_loss",))
            # its evaluation at PAUSE_AT is stored (the eval row comes after the step's progress row)
            if frame.loc[frame["eval_loss"].notna(), "step"].ge(PAUSE_AT).any():
                runner.tick_once()  # the driver reports (and prunes) before the trial goes on
                let_go(release, run.id)
        return not record.read(sweep_id).status.is_active()
    wait_until(settled, timeout=120, what=f"sweep {sweep_id} to settle")


def test_a_grid_sweep_runs_each_point_once_and_picks_the_best(orch, release, home):
    runner = SweepRunner(orch, start_thread=False)
    sweep_id = runner.create(sweep_config([SMALL, GOOD, LARGE], pruner="none"))
    drive(runner, orch, sweep_id, release)

    state = record.read(sweep_id)
    assert state.status is SweepStatus.COMPLETED
    study = open_study(state.folder, state.config.spec)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    assert study.best_trial.params == {"learning_rate": GOOD}
    assert study.best_value == pytest.approx(1.1)  # level 1 at the last evaluation, step 10: 1 * (1 + 1/10)
    runs = trial_runs(orch, sweep_id)
    assert sorted(runs) == [0, 1, 2] and all(len(r) == 1 for r in runs.values())
    assert {r[0].status for r in runs.values()} == {RunStatus.COMPLETED}
    for number, (run,) in runs.items():  # each run trained its trial's value
        assert orch.run_config(run.id)["learning_rate"] == study.trials[number].params["learning_rate"]

    # the database is a cache: a rebuild restores which runs are the sweep's trials
    expected = {r.id: r.sweep_trial for r in orch.store.sweep_runs(sweep_id)}
    runner.close()
    orch.close()
    rebuild.rebuild()
    from db.store import Store

    assert {r.id: r.sweep_trial for r in Store().sweep_runs(sweep_id)} == expected


def test_a_diverging_trial_is_pruned_and_stopped_with_its_run_kept(orch, release, home):
    runner = SweepRunner(orch, start_thread=False)
    sweep_id = runner.create(sweep_config([GOOD, 1.0], pruner="none"))
    drive(runner, orch, sweep_id, release)

    state = record.read(sweep_id)
    study = open_study(state.folder, state.config.spec)
    by_lr = {t.params["learning_rate"]: t for t in study.trials}
    assert by_lr[GOOD].state is TrialState.COMPLETE
    assert by_lr[1.0].state is TrialState.PRUNED
    assert by_lr[1.0].user_attrs[PRUNED] == "train loss 16 at step 4 is over 4x its first value 2"
    (run,) = trial_runs(orch, sweep_id)[by_lr[1.0].number]
    assert run.status is RunStatus.STOPPED and run.steps_done < STEPS  # stopped through Stop: saved, kept
    assert [e.message for e in orch.events(run.id) if e.kind == "sweep"] == \
        [f"pruned by sweep {sweep_id}: {by_lr[1.0].user_attrs[PRUNED]}"]


def test_median_pruning_stops_a_trial_worse_than_the_finished_ones(orch, release, home):
    runner = SweepRunner(orch, start_thread=False)
    sweep_id = runner.create(sweep_config([GOOD, SMALL], pruner="median", seed=1))
    drive(runner, orch, sweep_id, release)

    study = open_study(record.sweep_dir(sweep_id), record.read(sweep_id).config.spec)
    states = {t.params["learning_rate"]: t.state for t in study.trials}
    first = study.trials[0].params["learning_rate"]
    # the first trial has nobody to be compared with; the second is pruned only when it is the worse one
    assert states == ({GOOD: TrialState.COMPLETE, SMALL: TrialState.PRUNED} if first == GOOD
                      else {SMALL: TrialState.COMPLETE, GOOD: TrialState.COMPLETE})


def test_stop_and_resume_lose_no_trial_and_run_none_twice(orch, release, home):
    runner = SweepRunner(orch, start_thread=False)
    sweep_id = runner.create(sweep_config([SMALL, GOOD, LARGE], pruner="none"))

    def first_trial_paused() -> bool:
        runs = orch.store.sweep_runs(sweep_id)
        return bool(runs) and orch.snapshot(runs[0].id).step >= PAUSE_AT

    wait_until(lambda: runner.tick_once() or first_trial_paused(), timeout=60, what="the first trial to pause")
    runner.stop(sweep_id)
    runner.tick_once()  # marks the trial paused and asks its run to stop and save
    let_go(release, orch.store.sweep_runs(sweep_id)[0].id)
    wait_until(lambda: runner.tick_once() or record.read(sweep_id).status is SweepStatus.STOPPED, timeout=60,
               what="the sweep to stop")
    study = open_study(record.sweep_dir(sweep_id), record.read(sweep_id).config.spec)
    (trial,) = study.trials  # nothing new started while it stopped
    assert trial.state is TrialState.RUNNING and trial.user_attrs[PAUSED] is True
    (stopped,) = trial_runs(orch, sweep_id)[0]
    assert stopped.status is RunStatus.STOPPED

    runner.resume(sweep_id)
    drive(runner, orch, sweep_id, release)
    study = open_study(record.sweep_dir(sweep_id), record.read(sweep_id).config.spec)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    assert sorted(t.params["learning_rate"] for t in study.trials) == [SMALL, GOOD, LARGE]
    runs = trial_runs(orch, sweep_id)
    assert [len(runs[n]) for n in (0, 1, 2)] == [2, 1, 1]  # the stopped trial continued in one resumed run
    resumed = runs[0][1]
    assert resumed.parent_run_id == stopped.id and resumed.resumed_from_step == stopped.steps_done
    assert sorted(study.trials[0].intermediate_values) == [5, 10]  # its evaluations from both runs, each once


def test_a_restart_mid_sweep_reattaches_and_starts_an_asked_trial_once(make_orch, release, home):
    first = make_orch()
    runner = SweepRunner(first, start_thread=False)
    sweep_id = runner.create(sweep_config([SMALL, GOOD, LARGE], pruner="none"))
    wait_until(lambda: runner.tick_once() or bool(first.store.sweep_runs(sweep_id)), timeout=60,
               what="the first trial")
    runner.close()
    first.close()  # the dashboard goes away; the trial's worker keeps running
    # ... after it had asked Optuna for a trial and before it started its run:
    state = record.read(sweep_id)
    open_study(state.folder, state.config.spec).ask()

    second = make_orch()
    again = SweepRunner(second, start_thread=False)
    drive(again, second, sweep_id, release)
    study = open_study(state.folder, state.config.spec)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    assert sorted(t.params["learning_rate"] for t in study.trials) == [SMALL, GOOD, LARGE]
    runs = trial_runs(second, sweep_id)
    assert sorted(runs) == [0, 1, 2] and all(len(r) == 1 for r in runs.values())


def test_a_second_process_does_not_drive_a_sweep_already_driven(make_orch, release, home):
    one, two = make_orch(), make_orch()
    a, b = SweepRunner(one, start_thread=False), SweepRunner(two, start_thread=False)
    sweep_id = a.create(sweep_config([SMALL, GOOD]))
    a.tick_once()
    b.tick_once()
    assert (a.driving(), b.driving()) == ([sweep_id], [])
    a.close()
    b.tick_once()
    assert b.driving() == [sweep_id]
