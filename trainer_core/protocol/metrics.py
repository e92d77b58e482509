"""The one list of wide metric columns, the rules for open metric keys, and how two rows of the same step
merge. The store's table, the live state's frame, the charts and the CLI's export all use these.

Metrics are open (DESIGN rule 15): besides the wide fields below, a progress or eval event carries any
numeric ``metrics: {key: value}`` (TRL's ``rewards/chosen``, GRPO's ``rewards/<function>/mean``...). A metric
row is one flat dict per step: ``step``, the wide fields and the open keys side by side (an open key can
never be a wide field's name, so they cannot collide); the store keeps the open keys in a long table.
"""
from __future__ import annotations

from numbers import Real
from typing import Any, Iterable, Mapping

# Values of one step, besides the step itself. ``nonfinite`` names the fields whose value was NaN/inf
# (stored as NULL): a NaN loss is news, not noise.
METRIC_FIELDS = ("epoch", "loss", "eval_loss", "learning_rate", "grad_norm", "tokens_seen", "tokens_per_s",
                 "memory_mb", "elapsed_s", "wall_time", "nonfinite")
METRIC_COLUMNS = ["step", *METRIC_FIELDS]
WIDE_NAMES = frozenset(METRIC_COLUMNS)
METRIC_KEY_MAX = 200  # characters of an open metric key


def key_problem(key: Any) -> str:
    """Why ``key`` cannot name an open metric; "" when it can."""
    if not isinstance(key, str):
        return f"is a {type(key).__name__}, not text"
    if not key:
        return "is empty"
    if len(key) > METRIC_KEY_MAX:
        return f"is {len(key)} characters long; at most {METRIC_KEY_MAX}"
    if not key.isprintable():
        return "contains a control character (NUL, newline, tab...): use printable characters only"
    if "," in key:  # the row's ``nonfinite`` lists field names comma-separated
        return "contains a comma: use another separator such as '/' or '_'"
    if key in WIDE_NAMES:
        return "is a wide metric field: send it as the event's own field"
    return ""


def values_problem(metrics: dict) -> str:
    """Why an event's ``metrics`` mapping is not one (keys as ``key_problem`` says, values numbers or null:
    a non-finite value is null, named in the event's ``nonfinite``); "" when it is."""
    for key, value in metrics.items():
        problem = key_problem(key)
        if problem:
            return f"key {key[:60]!r} {problem}" if isinstance(key, str) else f"key {problem}"
        if value is not None and type(value) not in (int, float):  # a JSON true is not a number
            return f"{key!r} is {value!r}, expected a number or null"
    return ""


def open_metrics(logs: Mapping[str, Any], skip: Iterable[str] = ()) -> tuple[dict[str, float], dict[str, str]]:
    """The numeric entries of a trainer's ``logs`` that are not wide fields (nor in ``skip``), as floats;
    and the keys left out for their name, with why. Text and other values are not metrics and are ignored;
    NaN/inf stay (the event's encoder cleans them and remembers where they were)."""
    skipped = set(skip)
    values: dict[str, float] = {}
    refused: dict[str, str] = {}
    for key, value in logs.items():
        if key in WIDE_NAMES or key in skipped or isinstance(value, bool) or not isinstance(value, Real):
            continue
        problem = key_problem(key)
        if problem:
            refused[str(key)[:60]] = problem
        else:
            values[key] = float(value)
    return values, refused


def open_keys(row: Mapping[str, Any]) -> list[str]:
    """The open metric keys of a row (those that are not ``step`` or a wide field)."""
    return [key for key in row if key not in WIDE_NAMES]



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
