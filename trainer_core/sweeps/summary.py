"""What the sweep view and the CLI show of a sweep: one row per trial (its settings, objective, outcome and run),
the best trial, and Optuna's parameter importance when it can be computed."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from db.entities import RunRecord
from trainer_core.sweeps import record
from trainer_core.sweeps.driver import ERROR, PRUNED, open_study

OUTCOME = {TrialState.RUNNING: "running", TrialState.COMPLETE: "completed", TrialState.PRUNED: "pruned",
           TrialState.FAIL: "failed", TrialState.WAITING: "waiting"}


@dataclass(frozen=True)
class SweepSummary:
    state: record.SweepState
    trials: list[dict[str, Any]]  # trial, outcome, objective, each param, run, run_id, status, step, note, best
    best: int | None  # the best trial's number
    importance: dict[str, float]  # param -> share (empty: fewer than two finished trials, or one setting searched)

    @property
    def params(self) -> list[str]:
        return [p.name for p in self.state.config.spec.params]


def summarize(sweep_id: str, runs: list[RunRecord], importance: bool = True) -> SweepSummary:
    """``runs``: the sweep's trial runs (Store.sweep_runs), oldest first."""
    state = record.read(sweep_id)
    study = open_study(state.folder, state.config.spec)
    trials = study.get_trials(deepcopy=False)
    latest: dict[int, RunRecord] = {}
    for run in runs:
        latest[run.sweep_trial] = run
    done = [t for t in trials if t.state is TrialState.COMPLETE]
    best = min(done, key=lambda t: t.value if state.config.spec.direction == "minimize" else -t.value) if done else None
    rows = []
    for t in trials:
        run = latest.get(t.number)
        value = t.value if t.state is TrialState.COMPLETE else (
            t.intermediate_values[max(t.intermediate_values)] if t.intermediate_values else None)
        rows.append({"trial": t.number, "outcome": OUTCOME.get(t.state, t.state.name.lower()), "objective": value,
                     **{p: t.params.get(p) for p in (x.name for x in state.config.spec.params)},
                     "run": run.name if run else "", "run_id": run.id if run else "",
                     "status": run.status.label if run else "", "step": run.steps_done if run else 0,
                     "note": t.user_attrs.get(PRUNED) or t.user_attrs.get(ERROR) or "",
                     "best": best is not None and t.number == best.number})
    searched = len(state.config.spec.params)  # with one setting, its importance is 100% by definition
    return SweepSummary(state, rows, best.number if best else None,
                        _importance(study) if importance and len(done) >= 2 and searched >= 2 else {})


def _importance(study: optuna.Study) -> dict[str, float]:
    """Optuna's parameter importance (fANOVA) over the finished trials; empty when it cannot be computed (every
    finished trial tried the same values)."""
    try:
        return dict(optuna.importance.get_param_importances(study))
    except (RuntimeError, ValueError, ZeroDivisionError):
        return {}


def progress_line(summary: SweepSummary) -> str:
    counts: dict[str, int] = {}
    for row in summary.trials:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    parts = ", ".join(f"{n} {name}" for name, n in counts.items()) or "no trials yet"
    best = next((r for r in summary.trials if r["best"]), None)
    objective = summary.state.config.spec.objective
    best_text = f"; best: trial {best['trial']} {objective} {best['objective']:.4g} " + \
        ", ".join(f"{p}={best[p]!r}" for p in summary.params) if best else ""
    return f"sweep {summary.state.id} {summary.state.status.value}: {parts}{best_text}"
