"""A sweep's charts, pure functions of its trials table (trainer_core/sweeps/summary.py's rows as a DataFrame):
the objective per trial with the best-so-far line and the best trial marked, parallel coordinates over the searched
settings, and the parameter importance."""
from __future__ import annotations

import math

import altair as alt
import numpy as np
import pandas as pd

OUTCOME_COLOURS = {"completed": "#4c78a8", "pruned": "#f58518", "failed": "#e45756", "running": "#54a24b",
                   "waiting": "#9d9d9d"}
HEIGHT = 300


def _finite(values: pd.Series) -> pd.Series:
    numbers = pd.to_numeric(values, errors="coerce")
    return numbers.where(np.isfinite(numbers))


def objective_chart(trials: pd.DataFrame, objective: str, direction: str = "minimize") -> alt.LayerChart:
    """Each trial's objective (completed, pruned at its last evaluation, running so far), coloured by outcome; the
    best value so far over the completed trials as a step line; the best trial as a larger ringed point."""
    data = trials.assign(objective=_finite(trials["objective"])).dropna(subset=["objective"])
    data = data[["trial", "outcome", "objective", "best"]].sort_values("trial")
    done = data[data["outcome"] == "completed"]
    running_best = (done["objective"].cummin() if direction == "minimize" else done["objective"].cummax())
    best_line = pd.DataFrame({"trial": done["trial"], "best so far": running_best})
    x = alt.X("trial:Q", title="trial", axis=alt.Axis(tickMinStep=1))
    y_title = f"{objective} ({'lower' if direction == 'minimize' else 'higher'} is better)"
    values = data["objective"]
    # a diverged trial's loss is often tens of times the others': a log scale keeps the rest apart
    log = bool(len(values)) and values.min() > 0 and values.max() / values.min() > 10
    scale = alt.Scale(type="log") if log else alt.Scale(zero=False)
    points = alt.Chart(data).mark_circle(size=80, opacity=0.9).encode(
        x=x, y=alt.Y("objective:Q", title=y_title + (", log scale" if log else ""), scale=scale),
        color=alt.Color("outcome:N", scale=alt.Scale(domain=list(OUTCOME_COLOURS),
                                                     range=list(OUTCOME_COLOURS.values())), title="outcome"),
        tooltip=["trial:Q", "outcome:N", alt.Tooltip("objective:Q", format=".4g")])
    line = alt.Chart(best_line).mark_line(interpolate="step-after", color="#888", strokeDash=[4, 3]).encode(
        x=x, y=alt.Y("best so far:Q", scale=scale), tooltip=[alt.Tooltip("best so far:Q", format=".4g")])
    best = alt.Chart(data[data["best"]]).mark_point(size=400, shape="circle", strokeWidth=3, color="#e45756",
                                                    filled=False).encode(x=x, y=alt.Y("objective:Q", scale=scale))
    return alt.layer(line, points, best).properties(title=f"{objective} per trial (ringed: the best trial)",
                                                    height=HEIGHT)


def parallel_chart(trials: pd.DataFrame, params: list[str], objective: str) -> alt.Chart:
    """Parallel coordinates: one line per finished trial across its settings and the objective, each axis scaled
    to 0..1 over the trials (a log scale for a setting that spans more than two decades), coloured by the
    objective. Text settings are placed by their order of first appearance."""
    data = trials[trials["outcome"].isin(["completed", "pruned"])].copy()
    data["objective"] = _finite(data["objective"])
    data = data.dropna(subset=["objective"])
    rows = []
    for column in [*params, "objective"]:
        values = data[column]
        numbers = pd.to_numeric(values, errors="coerce")
        if numbers.isna().any():  # a categorical setting (text, or a mix)
            order = {v: i for i, v in enumerate(dict.fromkeys(values.astype(str)))}
            numbers = values.astype(str).map(order).astype(float)
        elif numbers.min() > 0 and numbers.max() / numbers.min() > 100:
            numbers = numbers.map(math.log10)
        span = numbers.max() - numbers.min()
        scaled = (numbers - numbers.min()) / span if span else numbers * 0 + 0.5
        rows += [{"trial": t, "axis": column, "position": p, "value": str(v), "objective": o}
                 for t, p, v, o in zip(data["trial"], scaled, values, data["objective"])]
    frame = pd.DataFrame(rows, columns=["trial", "axis", "position", "value", "objective"])
    return alt.Chart(frame).mark_line(point=True, opacity=0.7).encode(
        x=alt.X("axis:N", sort=[*params, "objective"], title=None),
        y=alt.Y("position:Q", axis=None),
        color=alt.Color("objective:Q", scale=alt.Scale(scheme="viridis"), title=objective),
        detail="trial:N", tooltip=["trial:N", "axis:N", "value:N"],
    ).properties(title="Parallel coordinates (finished trials)", height=HEIGHT)


def importance_chart(importance: dict[str, float]) -> alt.Chart:
    """Optuna's parameter importance, one bar per searched setting, largest first."""
    frame = pd.DataFrame({"setting": list(importance), "importance": list(importance.values())})
    return alt.Chart(frame).mark_bar().encode(
        x=alt.X("importance:Q", axis=alt.Axis(format=".0%"), title="share of the objective's variance"),
        y=alt.Y("setting:N", sort="-x", title=None),
        tooltip=["setting:N", alt.Tooltip("importance:Q", format=".1%")],
    ).properties(title="Parameter importance (Optuna, fANOVA)", height=max(60, 30 * len(frame)))
