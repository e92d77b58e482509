"""A sweep checked before anything starts: every problem of its ``sweep:`` section, its ranges, its budget and its
objective, and of each range's ends applied to the base config, each naming its field and the fix."""
from __future__ import annotations

from typing import Any

from trainer_core.config import ConfigError, FieldError, TrainConfig
from trainer_core.methods import METHODS
from trainer_core.methods.base import TRAINER_METRICS
from trainer_core.sweeps.spec import (_NOT_A_LIST, DEFAULT_OBJECTIVE, DIRECTIONS, PRUNERS, SEARCHES, ParamRange,
                                      SweepConfig, SweepSpec, apply)


def read(data: dict[str, Any]) -> tuple[SweepConfig, list[FieldError]]:
    """A YAML mapping (a run config with a ``sweep:`` section) read and checked: no errors means ready to start."""
    config, errors = SweepConfig.from_mapping(data)
    return config, errors or problems(config.spec, config.base)


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


