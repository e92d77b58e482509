"""What a sweep decides from a trial's numbers, without Optuna or the orchestrator: whether the run diverged, what
it reported for the objective, and the trial's value once its run has ended."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class Row:
    """One metric row of a trial's run: the step, the train loss, the objective, the fields logged non-finite."""

    step: int
    loss: float | None
    objective: float | None
    nonfinite: tuple[str, ...] = ()


def divergence(rows: Iterable[Row], factor: float, objective: str) -> str | None:
    """Why the run diverged (its train loss or objective was NaN/inf, or the train loss rose past ``factor`` times
    its first value), or None."""
    first = None
    for row in rows:
        bad = [name for name in ("loss", objective) if name in row.nonfinite]
        if bad:
            return f"{bad[0]} was not finite at step {row.step}"
        if row.loss is None:
            continue
        if first is None:
            first = row.loss
        elif first > 0 and row.loss > factor * first:
            return f"train loss {row.loss:.4g} at step {row.step} is over {factor:g}x its first value {first:.4g}"
    return None


def new_reports(rows: Iterable[Row], reported: Iterable[int]) -> list[tuple[int, float]]:
    """(step, objective) of the evaluations not yet reported to the trial, in step order (finite values only)."""
    done = set(reported)
    return [(r.step, r.objective) for r in rows
            if r.objective is not None and math.isfinite(r.objective) and r.step not in done]


def final_value(intermediate: dict[int, float]) -> float | None:
    """A finished trial's objective: its last evaluation (the model it ended with), None without one."""
    return intermediate[max(intermediate)] if intermediate else None
