"""What the Sweeps page shows, without Streamlit: the sweep picker's labels, the sweep's header line, and the trials
table as the page draws it (settings, objective, outcome, run; the best trial starred)."""
from __future__ import annotations

import pandas as pd
import yaml

from trainer_core.auth.access import Actor
from trainer_core.config import ConfigError, FieldError, TrainConfig, load_yaml
from trainer_core.jobs.refusals import RunRefused
from trainer_core.sweeps import checks
from trainer_core.sweeps.runner import SweepRunner
from trainer_core.sweeps.summary import SweepSummary
from ui import format as fmt

# New run's Sweep section starts from this: the settings most runs search first
SWEEP_EXAMPLE = """\
search: tpe            # grid, random or tpe
params:
  learning_rate: {low: 1.0e-5, high: 1.0e-3, log: true}
  lora_r: [8, 16, 32]
n_trials: 8            # and/or timeout_minutes: 60
parallel: 1
objective: eval_loss   # needs an eval set (eval_fraction above)
direction: minimize
pruner: median         # median, halving or none
"""

STATUS_ICONS = {"running": "🏃", "stopping": "🛑", "stopped": "💾", "completed": "✅"}


def start_from_form(runner: SweepRunner, cfg: TrainConfig, text: str, actor: Actor) -> tuple[str | None,
                                                                                            list[FieldError]]:
    """New run's Sweep section: the form's config as the base and the section's YAML as ``sweep:``. Returns the
    sweep's id, or every problem (the section's, its ranges', the base config's as a run)."""
    try:
        section = load_yaml(text) or {}
    except (yaml.YAMLError, RecursionError) as exc:
        return None, [FieldError("sweep", f"not valid YAML: {exc}")]
    config, errors = checks.read({**cfg.to_public_dict(), "sweep": section})
    if errors:
        return None, errors
    try:
        return runner.create(config, actor=actor), []
    except ConfigError as exc:
        return None, exc.errors
    except RunRefused as exc:
        return None, [FieldError("sweep", str(exc))]


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
