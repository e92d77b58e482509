"""The one list of metric columns, and how two rows of the same step merge. The store's table, the live
state's frame, the charts and the CLI's export all use these; a new metric is added here once."""
from __future__ import annotations

from typing import Any, Iterable

# Values of one step, besides the step itself. ``nonfinite`` names the fields whose value was NaN/inf
# (stored as NULL): a NaN loss is news, not noise.
METRIC_FIELDS = ("epoch", "loss", "eval_loss", "learning_rate", "grad_norm", "tokens_seen", "tokens_per_s",
                 "memory_mb", "elapsed_s", "wall_time", "nonfinite")
METRIC_COLUMNS = ["step", *METRIC_FIELDS]


def merge_nonfinite(old: str, new: str) -> str:
    if not new or new == old:
        return old or ""
    if not old and "," not in new:
        return new  # the common cases, without building sets
    names = set(filter(None, (old or "").split(","))) | set(filter(None, (new or "").split(",")))
    return ",".join(sorted(names))


def merge_metric(into: dict[str, Any], row: dict[str, Any]) -> None:
    """Merge ``row`` into ``into`` for the same step: non-empty values win, non-finite names are united."""
    for key, value in row.items():
        if key == "nonfinite":
            into["nonfinite"] = merge_nonfinite(into.get("nonfinite", ""), value)
        elif value is not None and value != "":
            into[key] = value


def merge_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per step (PostgreSQL refuses to upsert the same key twice in one statement)."""
    merged: dict[int, dict[str, Any]] = {}
    for row in rows:
        merge_metric(merged.setdefault(int(row["step"]), {"step": int(row["step"])}), row)
    return list(merged.values())


def thin(values: list[float], max_points: int) -> list[float]:
    """``max_points`` evenly spaced samples that include the first and the last value (all when fewer)."""
    if len(values) <= max_points:
        return list(values)
    if max_points <= 1:
        return [values[-1]]
    last = len(values) - 1
    return [values[round(i * last / (max_points - 1))] for i in range(max_points)]
