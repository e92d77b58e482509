"""What the Sweeps page shows, without Streamlit: the sweep picker's labels, the sweep's header line, and the trials
table as the page draws it (settings, objective, outcome, run; the best trial starred)."""
from __future__ import annotations

import pandas as pd

from trainer_core.sweeps.summary import SweepSummary
from ui import format as fmt

STATUS_ICONS = {"running": "🏃", "stopping": "🛑", "stopped": "💾", "completed": "✅"}


def sweep_label(summary_state) -> str:
    state = summary_state
    params = ", ".join(p.name for p in state.config.spec.params)
    return f"{STATUS_ICONS.get(state.status.value, '')} {state.name} · {params} · {state.status.value}"


def header(summary: SweepSummary) -> str:
    """One line: status, search, objective, budget spent, parallel, time."""
    state, spec = summary.state, summary.state.config.spec
    budget = spec.trial_budget(state.n_trials)
    asked = len(summary.trials)
    trials = f"{asked} of {budget} trials" if budget is not None else f"{asked} trials"
    timeout = f" of {fmt.duration(spec.timeout_minutes * 60)}" if spec.timeout_minutes else ""
    return (f"{STATUS_ICONS.get(state.status.value, '')} {state.status.value} · {spec.search} search · "
            f"{spec.objective} ({spec.direction}) · {trials} · {spec.parallel} at a time · pruner {spec.pruner} · "
            f"{fmt.duration(state.running_s)}{timeout} running · by {state.owner}")


def trials_frame(summary: SweepSummary) -> pd.DataFrame:
    """The trials table: one row per trial, the best one starred; a pruned trial shows its last evaluation."""
    columns = ["best", "trial", "outcome", "objective", *summary.params, "status", "step", "run", "note", "run_id"]
    frame = pd.DataFrame(summary.trials, columns=[c for c in columns if c != "best"] + ["best"])
    frame["best"] = frame["best"].map({True: "★", False: ""})
    return frame[columns]


def chart_frame(summary: SweepSummary) -> pd.DataFrame:
    """The trials as the charts read them (trainer_core/views/sweep_charts.py)."""
    return pd.DataFrame(summary.trials, columns=["trial", "outcome", "objective", "best", *summary.params])
