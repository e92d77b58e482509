"""A sweep's settings: what to search (ranges of a run's settings), how (grid, random, TPE), for how long, towards
what, and how bad trials end early. Read from the YAML ``sweep:`` section beside an ordinary run config (the base
every trial starts from); checks.py collects every problem, naming the field and the fix, before anything starts.

A setting is named by its TrainConfig key, dotted into a method's section ("learning_rate", "lora_r",
"dpo.beta"), and applied through ``TrainConfig.from_dict``, so a search keeps working when a field's type moves.
"""
from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from trainer_core.config import FieldError

SEARCHES = ("grid", "random", "tpe")
DIRECTIONS = ("minimize", "maximize")
PRUNERS = ("median", "halving", "none")
DEFAULT_OBJECTIVE = "eval_loss"
DEFAULT_TRIALS = 10
_SPEC_KEYS = ("name", "search", "params", "n_trials", "timeout_minutes", "parallel", "objective", "direction",
              "pruner", "prune_warmup_steps", "diverge_factor", "seed")
_RANGE_KEYS = ("values", "low", "high", "log", "step", "grid_points")
_NOT_A_LIST = "<values: not a list>"  # kept in place of values written as something else, reported by checks.py


@dataclass(frozen=True)
class ParamRange:
    """One searched setting: a list of ``values``, or a numeric range from ``low`` to ``high`` (a log scale with
    ``log``; a ``step`` between values; ``grid_points`` values spread over it for a grid search)."""

    name: str
    values: tuple = ()
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    grid_points: int = 0

    @property
    def is_int(self) -> bool:
        return all(isinstance(v, int) and not isinstance(v, bool) for v in (self.low, self.high)) and \
            (self.step is None or isinstance(self.step, int))

    def grid(self) -> list:
        """The values a grid search tries."""
        if self.values:
            return list(self.values)
        if self.grid_points:
            n = self.grid_points
            if n == 1:
                return [self.low]
            if self.log:
                a, b = math.log(self.low), math.log(self.high)
                points = [math.exp(a + (b - a) * i / (n - 1)) for i in range(n)]
            else:
                points = [self.low + (self.high - self.low) * i / (n - 1) for i in range(n)]
            return sorted({round(p) for p in points}) if self.is_int else [float(f"{p:.6g}") for p in points]
        step = self.step if self.step is not None else 1
        count = int(math.floor((self.high - self.low) / step + 1e-9)) + 1
        return [self.low + i * step if self.is_int else float(f"{self.low + i * step:.10g}") for i in range(count)]

    def to_dict(self) -> dict[str, Any]:
        if self.values:
            return {"values": list(self.values)}
        out: dict[str, Any] = {"low": self.low, "high": self.high}
        if self.log:
            out["log"] = True
        if self.step is not None:
            out["step"] = self.step
        if self.grid_points:
            out["grid_points"] = self.grid_points
        return out


@dataclass(frozen=True)
class SweepSpec:
    """The ``sweep:`` section. ``n_trials`` left out: the whole grid (grid search) or 10; 0: until the time budget
    ends (a grid search: the whole grid)."""

    params: tuple[ParamRange, ...] = ()
    search: str = "tpe"  # grid, random or tpe (Optuna's GridSampler, RandomSampler, TPESampler)
    n_trials: int | None = None  # trials to run (a trial is one ordinary training run)
    timeout_minutes: float = 0.0  # no trial starts after this much sweep time (0: no time budget)
    parallel: int = 1  # trials under way at once (the queue still runs only what the devices allow)
    objective: str = DEFAULT_OBJECTIVE  # a metric the method logs at its evaluations
    direction: str = "minimize"
    pruner: str = "median"  # median, halving (successive halving) or none, fed by each trial's evaluations
    prune_warmup_steps: int = 0  # no pruning before this step
    diverge_factor: float = 4.0  # a trial whose train loss rises past this times its first loss (or NaN) ends early
    seed: int = 0
    name: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "params"}
        return {**data, "params": {p.name: p.to_dict() for p in self.params}}

    def grid_size(self) -> int:
        return math.prod(len(p.grid()) for p in self.params)

    def trial_budget(self, n_trials: int | None = None) -> int | None:
        """How many trials the sweep runs at most (None: until its time budget ends); ``n_trials`` replaces the
        spec's (a sweep extended since)."""
        n_trials = self.n_trials if n_trials is None else n_trials
        if self.search == "grid":
            return min(n_trials, self.grid_size()) if n_trials else self.grid_size()
        return DEFAULT_TRIALS if n_trials is None else (n_trials or None)


def parse(section: Any, errors: list[FieldError]) -> SweepSpec:
    """The ``sweep:`` section as a SweepSpec; what cannot be read is added to ``errors`` (fields left default)."""
    if not isinstance(section, dict):
        errors.append(FieldError("sweep", "must be a mapping: search, params, n_trials, objective, ..."))
        return SweepSpec()
    values: dict[str, Any] = {}
    for key, value in section.items():
        if key not in _SPEC_KEYS:
            errors.append(FieldError(f"sweep.{key}", "unknown sweep setting" + _did_you_mean(key, _SPEC_KEYS)))
        elif key == "params":
            values["params"] = _parse_params(value, errors)
        else:
            values[key] = _number(value) if key not in ("name", "search", "objective", "direction", "pruner") else value
    return SweepSpec(**values)


def _parse_params(section: Any, errors: list[FieldError]) -> tuple[ParamRange, ...]:
    if not isinstance(section, dict):
        errors.append(FieldError("sweep.params", "must map each setting to its range, e.g. "
                                                 "learning_rate: {low: 1e-5, high: 1e-3, log: true}"))
        return ()
    params = []
    for name, rng in section.items():
        where = f"sweep.params.{name}"
        if isinstance(rng, list):
            rng = {"values": rng}
        if not isinstance(rng, dict):
            errors.append(FieldError(where, "give a list of values, or {low: ..., high: ...} (log: true, step: ...)"))
            continue
        unknown = [k for k in rng if k not in _RANGE_KEYS]
        for key in unknown:
            errors.append(FieldError(f"{where}.{key}", "unknown range setting" + _did_you_mean(key, _RANGE_KEYS)))
        values = rng.get("values") or []
        params.append(ParamRange(name=str(name), values=tuple(_number(v) for v in values) if isinstance(values, list)
                                 else (_NOT_A_LIST,), low=_number(rng.get("low")), high=_number(rng.get("high")),
                                 log=bool(rng.get("log", False)), step=_number(rng.get("step")),
                                 grid_points=rng.get("grid_points", 0)))
    return tuple(params)


def _number(value: Any) -> Any:
    """YAML 1.1 reads 1e-5 (no dot) as text: a number written that way is a number here."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


# ====================================================================== trials
def apply(base: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """``base`` with each dotted setting set ("dpo.beta" goes into the dpo section)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for name, value in values.items():
        head, _, rest = name.partition(".")
        if rest:
            section = out.setdefault(head, {})
            section[rest] = value
        else:
            out[head] = value
    return out


def grid_space(spec: SweepSpec) -> dict[str, list]:
    return {p.name: p.grid() for p in spec.params}


def grid_points(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every point of the grid (tests and the sweep view's count)."""
    space = grid_space(spec)
    return [dict(zip(space, combo)) for combo in itertools.product(*space.values())]


def _did_you_mean(name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]}?" if close else ""


@dataclass(frozen=True)
class SweepConfig:
    """A sweep as a file holds it: the base run config (TrainConfig mapping, no secrets) and its ``sweep:``."""

    base: dict[str, Any] = field(default_factory=dict)
    spec: SweepSpec = field(default_factory=SweepSpec)

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> tuple["SweepConfig", list[FieldError]]:
        """Split a YAML mapping into base and ``sweep:``; the errors say what could not be read (checks.read also
        checks what was read)."""
        errors: list[FieldError] = []
        base = {k: v for k, v in data.items() if k != "sweep"}
        if "sweep" not in data:
            errors.append(FieldError("sweep", "the file has no sweep: section (search, params, n_trials, objective)"))
            return cls(base, SweepSpec()), errors
        return cls(base, parse(data["sweep"], errors)), errors

    def to_dict(self) -> dict[str, Any]:
        return {**self.base, "sweep": self.spec.to_dict()}
