"""The Sweeps page and its charts, on a sweep recorded as a finished one would be (its study, its state and its
trial runs' rows), so nothing trains here."""
from __future__ import annotations

import json
import time

import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial
from streamlit.testing.v1 import AppTest

from db.entities import RunRecord
from db.store import Store
from tests.support import ROOT
from trainer_core.config import BUNDLED_MODEL, FieldError
from trainer_core.protocol.status import RunStatus
from trainer_core.sweeps import checks, record
from trainer_core.sweeps.driver import PRUNED, open_study
from trainer_core.sweeps.record import SweepStatus
from trainer_core.sweeps.summary import summarize
from trainer_core.views.sweep_charts import importance_chart, objective_chart, parallel_chart
from ui.sweeps import chart_frame, trials_frame

# (learning rate, lora_r, evaluations, outcome)
TRIALS = [(1e-5, 8, {5: 3.0, 10: 2.9}, "completed"), (1e-3, 16, {5: 1.2, 10: 1.1}, "completed"),
          (1e-4, 8, {5: 2.0, 10: 1.6}, "completed"), (1e-5, 16, {5: 3.5}, "pruned")]


@pytest.fixture
def finished_sweep(home) -> str:
    config, errors = checks.read({"model_name": BUNDLED_MODEL, "max_steps": 10, "eval_fraction": 0.2,
                                  "eval_steps": 5, "sweep": {"name": "lr <b>and</b> rank", "search": "random",
                                                             "n_trials": 4, "params": {
                                                                 "learning_rate": [1e-5, 1e-4, 1e-3],
                                                                 "lora_r": [8, 16]}}})
    assert errors == []
    sweep_id = record.create(config, "ana", "operator", name=config.spec.name)
    study = open_study(record.sweep_dir(sweep_id), config.spec)
    store = Store()
    space = {"learning_rate": CategoricalDistribution([1e-5, 1e-4, 1e-3]), "lora_r": CategoricalDistribution([8, 16])}
    for number, (lr, rank, evals, outcome) in enumerate(TRIALS):
        pruned = outcome == "pruned"
        study.add_trial(create_trial(params={"learning_rate": lr, "lora_r": rank}, distributions=space,
                                     intermediate_values=evals, value=None if pruned else evals[max(evals)],
                                     state=TrialState.PRUNED if pruned else TrialState.COMPLETE,
                                     user_attrs={PRUNED: "eval_loss 3.5 at step 5 is worse than the median pruner "
                                                         "allows"} if pruned else {}))
        store.create_run(RunRecord(id=f"20260101-00000{number}-abcdef", name=f"trial {number}", created_at=time.time(),
                                   status=RunStatus.STOPPED if pruned else RunStatus.COMPLETED,
                                   steps_done=max(evals), sweep_id=sweep_id, sweep_trial=number))
    record.set_status(sweep_id, SweepStatus.COMPLETED)
    store.engine.dispose()
    return sweep_id


def test_the_summary_marks_the_best_trial_and_keeps_a_pruned_trials_last_evaluation(finished_sweep):
    summary = summarize(finished_sweep, Store().sweep_runs(finished_sweep))
    table = trials_frame(summary)
    assert table[["best", "trial", "outcome", "objective", "learning_rate", "status"]].values.tolist() == [
        ["", 0, "completed", 2.9, 1e-5, "Completed"], ["★", 1, "completed", 1.1, 1e-3, "Completed"],
        ["", 2, "completed", 1.6, 1e-4, "Completed"], ["", 3, "pruned", 3.5, 1e-5, "Stopped (saved)"]]
    assert table["note"].tolist()[3] == "eval_loss 3.5 at step 5 is worse than the median pruner allows"
    assert summary.best == 1 and set(summary.importance) == {"learning_rate", "lora_r"}


def test_the_charts_plot_every_trial_and_ring_the_best(finished_sweep):
    summary = summarize(finished_sweep, Store().sweep_runs(finished_sweep))
    frame = chart_frame(summary)
    spec = objective_chart(frame, "eval_loss").to_dict(validate=True)
    line, points, best = spec["layer"]
    data = spec["datasets"]
    assert [r["objective"] for r in data[points["data"]["name"]]] == [2.9, 1.1, 1.6, 3.5]
    assert [r["best so far"] for r in data[line["data"]["name"]]] == [2.9, 1.1, 1.1]
    assert [r["trial"] for r in data[best["data"]["name"]]] == [1]
    parallel = parallel_chart(frame, summary.params, "eval_loss").to_dict(validate=True)
    rows = parallel["datasets"][parallel["data"]["name"]]
    assert {(r["trial"], r["axis"]) for r in rows} == {(t, a) for t in range(4)
                                                       for a in ("learning_rate", "lora_r", "objective")}
    assert importance_chart(summary.importance).to_dict(validate=True)["mark"]["type"] == "bar"


def test_the_sweeps_page_shows_the_best_trial_and_its_trials(app_home, finished_sweep):
    at = AppTest.from_file(str(ROOT / "streamlit_app.py"), default_timeout=60)
    at.run()
    at.switch_page("pages/sweeps.py").run()
    assert not at.exception, at.exception
    assert [s.value for s in at.success] == ["Best: trial 1, eval_loss 1.1 with learning_rate = 0.001, lora_r = 16 "
                                             "(run `20260101-000001-abcdef`)"]
    assert [json.loads(c.proto.spec)["title"] for c in at.get("vega_lite_chart")] == [
        "eval_loss per trial (ringed: the best trial)", "Parallel coordinates (finished trials)",
        "Parameter importance (Optuna, fANOVA)"]
    (table,) = at.dataframe
    assert table.value["trial"].tolist() == [0, 1, 2, 3]
    assert [b.label for b in at.button][:3] == ["Stop sweep", "Resume", "Extend"]
    assert [b.disabled for b in at.button][:2] == [True, True]  # a completed sweep: only Extend
    next(b for b in at.button if b.label == "Open the best trial's run").click().run()
    assert not at.exception, at.exception
    assert at.session_state["detail_run_id"] == "20260101-000001-abcdef"


def test_new_runs_sweep_section_starts_a_sweep_of_the_forms_config_or_lists_every_problem(orch, home):
    from trainer_core.auth.access import Actor
    from trainer_core.config import TrainConfig
    from trainer_core.sweeps.runner import SweepRunner
    from ui.sweeps import SWEEP_EXAMPLE, start_from_form

    runner = SweepRunner(orch, start_thread=False)
    cfg = TrainConfig(max_steps=20, eval_fraction=0.1, eval_steps=5, learning_rate=3e-4)
    sweep_id, errors = start_from_form(runner, cfg, SWEEP_EXAMPLE, Actor.local())
    assert errors == []
    state = record.read(sweep_id)
    assert (state.config.base["learning_rate"], state.config.base["eval_steps"]) == (3e-4, 5)
    assert [p.name for p in state.config.spec.params] == ["learning_rate", "lora_r"]
    assert state.config.spec.n_trials == 8 and state.status is SweepStatus.RUNNING

    no_eval = TrainConfig(max_steps=20)
    assert start_from_form(runner, no_eval, "params: {learning_rate: {low: 0, high: 1.0e-3, log: true}}",
                           Actor.local()) == (None, [
        FieldError("sweep.params.learning_rate.low", "a log scale cannot reach zero or below: set low above 0 (e.g. "
                                                     "1e-06) or drop log"),
        FieldError("sweep.objective", "eval_loss needs an eval set: set eval_fraction (e.g. 0.1), local_eval_datasets "
                                      "or eval_split in the base config")])
    assert start_from_form(runner, no_eval, "params: [", Actor.local())[1][0].field == "sweep"
    assert record.list_ids() == [sweep_id]


def test_freeing_disk_deletes_only_the_other_trials_checkpoints_and_only_when_asked_on_a_completed_sweep(
        finished_sweep):
    from types import SimpleNamespace

    from trainer_core.jobs.refusals import RunRefused
    from trainer_core.protocol import paths
    from trainer_core.sweeps.runner import SweepRunner

    store = Store()
    runs = store.sweep_runs(finished_sweep)
    for run in runs:
        checkpoint = paths.run_dir(run.id) / "checkpoints" / "checkpoint-5"
        checkpoint.mkdir(parents=True)
        (checkpoint / "adapter_model.safetensors").write_bytes(b"x" * 1000)
        (paths.run_dir(run.id) / "adapter").mkdir()
    runner = SweepRunner(SimpleNamespace(store=store), start_thread=False)
    best = runs[1].id
    assert runner.free_disk(finished_sweep, keep={best}) == (3, 3000)
    assert [(paths.run_dir(r.id) / "checkpoints").exists() for r in runs] == [False, True, False, False]
    assert all((paths.run_dir(r.id) / "adapter").is_dir() for r in runs)  # the models stay
    assert [e.message for e in store.get_events(runs[0].id) if e.kind == "sweep"] == [
        f"checkpoints deleted to free disk (0.0 MB), asked on sweep {finished_sweep}"]
    record.set_status(finished_sweep, SweepStatus.STOPPED)
    with pytest.raises(RunRefused, match="Only a completed sweep's checkpoints are deleted"):
        runner.free_disk(finished_sweep, keep={best})


def test_historys_search_finds_a_sweeps_trials_by_its_id(finished_sweep):
    store = Store()
    assert [r.sweep_trial for r in store.list_runs(search=finished_sweep.upper())] == [3, 2, 1, 0]
    assert store.count_runs(search=finished_sweep) == 4


def test_a_diverged_trials_objective_puts_the_chart_on_a_log_scale():
    import pandas as pd

    frame = pd.DataFrame({"trial": [0, 1, 2], "outcome": ["pruned", "completed", "completed"],
                          "objective": [47.97, 1.692, 3.484], "best": [False, True, False]})
    spec = objective_chart(frame, "eval_loss").to_dict(validate=True)
    assert [layer["encoding"]["y"]["scale"] for layer in spec["layer"]] == [{"type": "log"}] * 3
    assert spec["layer"][1]["encoding"]["y"]["title"] == "eval_loss (lower is better), log scale"
    calm = objective_chart(frame.iloc[1:], "eval_loss").to_dict(validate=True)
    assert calm["layer"][1]["encoding"]["y"]["scale"] == {"zero": False}


def test_the_dashboards_orchestrator_comes_with_a_sweep_runner_closed_with_it(app_home):
    from ui.state import get_orchestrator, get_sweeps

    orch = get_orchestrator()
    runner = get_sweeps()
    assert runner.orch is orch and runner._thread.is_alive()
    orch.close()
    assert not runner._thread.is_alive() and runner.driving() == []
