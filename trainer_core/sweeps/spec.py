"""A sweep's settings: what to search (ranges of a run's settings), how (grid, random, TPE), for how long, towards
what, and how bad trials end early. Read from the YAML ``sweep:`` section beside an ordinary run config (the base
every trial starts from); ``problems`` collects every problem, naming the field and the fix, before anything starts.

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

from trainer_core.config import ConfigError, FieldError, TrainConfig
from trainer_core.methods import METHODS
from trainer_core.methods.base import TRAINER_METRICS

SEARCHES = ("grid", "random", "tpe")
DIRECTIONS = ("minimize", "maximize")
PRUNERS = ("median", "halving", "none")
DEFAULT_OBJECTIVE = "eval_loss"
DEFAULT_TRIALS = 10
_SPEC_KEYS = ("name", "search", "params", "n_trials", "timeout_minutes", "parallel", "objective", "direction",
              "pruner", "prune_warmup_steps", "diverge_factor", "seed")
_RANGE_KEYS = ("values", "low", "high", "log", "step", "grid_points")
_NOT_A_LIST = "<values: not a list>"  # kept in place of values written as something else, reported by problems()


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


# ====================================================================== validation
def problems(spec: SweepSpec, base: dict[str, Any]) -> list[FieldError]:
    """Every problem of a sweep over the base config ``base`` (a TrainConfig mapping), each naming its field and
    fix: the sweep's own settings, each range, the budget, the objective, and each range's ends applied to the
    base config (a value the run itself would refuse)."""
    errors: list[FieldError] = []
    if spec.search not in SEARCHES:
        errors.append(FieldError("sweep.search", f"unknown search {spec.search!r}: choose one of {', '.join(SEARCHES)}"))
    if spec.direction not in DIRECTIONS:
        errors.append(FieldError("sweep.direction", f"choose minimize or maximize, not {spec.direction!r}"))
    if spec.pruner not in PRUNERS:
        errors.append(FieldError("sweep.pruner", f"unknown pruner {spec.pruner!r}: choose one of {', '.join(PRUNERS)}"))
    mistyped = []
    for name in ("n_trials", "parallel", "prune_warmup_steps", "seed"):
        value = getattr(spec, name)
        if (value is not None or name != "n_trials") and (not isinstance(value, int) or isinstance(value, bool)):
            mistyped.append(FieldError(f"sweep.{name}", "must be a whole number"))
    for name in ("timeout_minutes", "diverge_factor"):
        if not isinstance(getattr(spec, name), (int, float)) or isinstance(getattr(spec, name), bool):
            mistyped.append(FieldError(f"sweep.{name}", "must be a number"))
    if mistyped:
        return errors + mistyped  # the checks below compare these values
    if not spec.params:
        errors.append(FieldError("sweep.params", "name at least one setting to search, e.g. "
                                                 "learning_rate: {low: 1e-5, high: 1e-3, log: true}"))
    for param in spec.params:
        errors += _range_problems(param, spec.search)
    errors += _budget_problems(spec)
    if spec.parallel < 1:
        errors.append(FieldError("sweep.parallel", "at least 1 trial must run at a time"))
    if spec.diverge_factor <= 1:
        errors.append(FieldError("sweep.diverge_factor", "must be above 1 (a loss this many times its first value "
                                                         "ends the trial)"))
    errors += _objective_problems(spec, base)
    if not errors:
        errors += _trial_config_problems(spec, base)
    return errors


def _range_problems(p: ParamRange, search: str) -> list[FieldError]:
    where = f"sweep.params.{p.name}"
    if p.values == (_NOT_A_LIST,):
        return [FieldError(f"{where}.values", "must be a list, e.g. [8, 16, 32]")]
    if p.values:
        if p.low is not None or p.high is not None:
            return [FieldError(where, "give values or low/high, not both")]
        return []
    if p.low is None or p.high is None:
        return [FieldError(where, "the range is empty: give values: [...] or both low and high")]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (p.low, p.high)):
        return [FieldError(where, "low and high must be numbers")]
    if not p.low < p.high:
        return [FieldError(where, f"the range is empty: low ({p.low}) must be below high ({p.high})")]
    if p.log and p.low <= 0:
        return [FieldError(f"{where}.low", f"a log scale cannot reach zero or below: set low above 0 (e.g. "
                                           f"{p.high / 1000:g}) or drop log")]
    if p.step is not None:
        if not isinstance(p.step, (int, float)) or p.step <= 0:
            return [FieldError(f"{where}.step", "must be a number above 0")]
        if p.log:
            return [FieldError(f"{where}.step", "a log scale takes no step: drop one of them")]
    if not isinstance(p.grid_points, int) or p.grid_points < 0:
        return [FieldError(f"{where}.grid_points", "must be a whole number of 1 or more")]
    if search == "grid" and not p.is_int and p.step is None and not p.grid_points:
        return [FieldError(where, "a grid search needs a finite set: give values, a step, or grid_points for this "
                                  "range")]
    return []


def _budget_problems(spec: SweepSpec) -> list[FieldError]:
    if spec.n_trials is not None and spec.n_trials < 0:
        return [FieldError("sweep.n_trials", "cannot be negative (0: the whole grid, or until timeout_minutes)")]
    if spec.timeout_minutes < 0:
        return [FieldError("sweep.timeout_minutes", "cannot be negative (0: no time budget)")]
    if spec.n_trials == 0 and spec.timeout_minutes == 0 and spec.search != "grid":
        return [FieldError("sweep.n_trials", "the budget cannot run one trial: set n_trials to 1 or more, or a "
                                             "timeout_minutes above 0")]
    return []


def _objective_problems(spec: SweepSpec, base: dict[str, Any]) -> list[FieldError]:
    """The objective must be a metric the method logs at its evaluations, and the base config must evaluate."""
    try:
        cfg = TrainConfig.from_dict(base)
    except ConfigError as exc:  # the base config's own problems: the run would report them the same way
        return exc.errors
    method = METHODS.get(cfg.method)
    logged = [m.key for m in method.metric_specs_of(cfg.to_dict())] if method is not None else [DEFAULT_OBJECTIVE]
    # a method's own metrics (a preference accuracy) come at each evaluation too, named eval_<key>
    trainer = {m.key for m in TRAINER_METRICS}
    produced = logged + [f"eval_{k}" for k in logged if k not in trainer and not k.startswith("eval")]
    if spec.objective not in produced:
        names = ", ".join(k for k in produced if k.startswith("eval")) or "eval_loss"
        return [FieldError("sweep.objective", f"method {cfg.method} does not log {spec.objective!r}: choose one of "
                                              f"{names}")]
    if spec.objective.startswith("eval") and not (cfg.eval_fraction > 0 or cfg.local_eval_datasets or cfg.eval_split):
        return [FieldError("sweep.objective", f"{spec.objective} needs an eval set: set eval_fraction (e.g. 0.1), "
                                              "local_eval_datasets or eval_split in the base config")]
    if cfg.max_steps and cfg.eval_steps > cfg.max_steps:
        return [FieldError("eval_steps", f"evaluates every {cfg.eval_steps} steps but a trial runs {cfg.max_steps}: "
                                         "set eval_steps to max_steps or less so each trial reports its objective")]
    return []


def _trial_config_problems(spec: SweepSpec, base: dict[str, Any]) -> list[FieldError]:
    """Each range's ends (every value of a list) applied to the base config, checked like a run: an unknown
    setting, a value of the wrong type and a value the run would refuse are all found here."""
    errors: list[FieldError] = []
    for p in spec.params:
        for value in (p.values or (p.low, p.high)):
            try:
                found = TrainConfig.from_dict(apply(base, {p.name: value})).validate()
            except ConfigError as exc:
                found = exc.errors
            errors += [FieldError(f"sweep.params.{p.name}", f"at {value!r}: {e.field}: {e.message}") for e in found]
            if found:
                break  # the first value refused tells the story (an unknown setting is unknown at every value)
    return errors


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
        """Split a YAML mapping into base and ``sweep:``; the errors list every problem (empty: ready to start)."""
        errors: list[FieldError] = []
        base = {k: v for k, v in data.items() if k != "sweep"}
        if "sweep" not in data:
            errors.append(FieldError("sweep", "the file has no sweep: section (search, params, n_trials, objective)"))
            return cls(base, SweepSpec()), errors
        spec = parse(data["sweep"], errors)
        if errors:
            return cls(base, spec), errors
        return cls(base, spec), problems(spec, base)

    def to_dict(self) -> dict[str, Any]:
        return {**self.base, "sweep": self.spec.to_dict()}
