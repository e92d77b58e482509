"""``method: {"type": "reinforcement", "reinforcement": {"grader": ..., "hyperparameters": ...}}`` as a GRPO run.

The grader becomes the run's ``grpo.rewards`` (graders.py); the hyperparameters OpenAI has only for reinforcement:

- ``compute_multiplier`` (over 0, up to 10): completions sampled per prompt, ``grpo.num_generations`` (the studio's
  4, or the extension's) times this, at least 2: more samples of each prompt is more exploration;
- ``eval_interval``: ``eval_steps``, how often ``validation_file`` is scored;
- ``eval_samples``: only ``auto``: the studio scores each validation prompt with ``num_generations`` completions;
- ``reasoning_effort``: accepted and ignored (a note in the job's events): the studio's models have no such setting.

``batch_size`` counts prompts, as OpenAI's does: the run's ``batch_size`` (completions per step) is it times
``num_generations``. The other GRPO settings (``max_completion_length``, ``temperature``, ...) come through the
extension's ``studio.grpo``; its ``rewards`` are the grader's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer_core.api import graders
from trainer_core.api.errors import invalid, unsupported
from trainer_core.methods.grpo_settings import GRPOSettings

HYPERPARAMETERS = ("compute_multiplier", "eval_interval", "eval_samples", "reasoning_effort")
EFFORTS = ("default", "low", "medium", "high")
SECTION_KEYS = ("grader", "hyperparameters")
MIN_GENERATIONS = 2  # GRPO compares completions of one prompt: a group needs two
PARAM = "method.reinforcement.hyperparameters"


@dataclass
class Plan:
    """What a reinforcement request sets in the run's config, and what the job reports."""

    grpo: dict[str, Any]  # the run's grpo section
    config: dict[str, Any] = field(default_factory=dict)  # other run settings (eval_steps)
    hyperparameters: dict[str, Any] = field(default_factory=dict)  # as the job reports them
    fields: dict[str, str] = field(default_factory=dict)  # the row fields the rewards read -> the grader's parameter
    notes: list[str] = field(default_factory=list)  # what was accepted but ignored


def plan(section: dict, hyper: dict, studio: dict) -> Plan:
    """The run settings of a reinforcement request (``hyper``: the method's own hyperparameters, as given)."""
    for key in section:
        if key not in SECTION_KEYS:
            raise invalid(f"method.reinforcement has no field {str(key)[:40]!r}: it takes grader and hyperparameters",
                          f"method.reinforcement.{str(key)[:40]}")
    if "grader" not in section:
        raise invalid("method.reinforcement.grader is required: how each completion is scored, e.g. {\"type\": "
                      "\"string_check\", \"input\": \"{{sample.output_text}}\", \"reference\": "
                      "\"{{item.reference_answer}}\", \"operation\": \"eq\"}", graders.PARAM)
    grpo = studio.get("grpo") or {}
    if not isinstance(grpo, dict):
        raise invalid("studio.grpo must be an object of GRPO settings (docs/methods.md)", "studio.grpo")
    if "rewards" in grpo:
        raise invalid("studio.grpo.rewards is set by method.reinforcement.grader in this API", "studio.grpo.rewards")
    rewards = graders.to_rewards(section["grader"])
    out = Plan(grpo={**grpo, "rewards": rewards.rewards}, fields=rewards.fields)
    multiplier = _multiplier(hyper.get("compute_multiplier"))
    if multiplier is not None:
        if "num_generations" in grpo:
            raise invalid("compute_multiplier and studio.grpo.num_generations both set it: give one",
                          f"{PARAM}.compute_multiplier")
        out.grpo["num_generations"] = max(MIN_GENERATIONS, round(GRPOSettings().num_generations * multiplier))
    interval = hyper.get("eval_interval")
    if interval not in (None, "auto"):
        if type(interval) is not int or not 1 <= interval <= 1_000_000:
            raise invalid(f"eval_interval must be an integer from 1 to 1000000 or \"auto\", not {interval!r}",
                          f"{PARAM}.eval_interval")
        if "eval_steps" in studio:
            raise invalid("eval_interval and studio.eval_steps both set it: give one", f"{PARAM}.eval_interval")
        out.config["eval_steps"] = interval
    if hyper.get("eval_samples") not in (None, "auto"):
        raise unsupported("eval_samples cannot be set here: the studio scores each prompt of validation_file with "
                          "as many completions as it samples per training prompt (compute_multiplier); leave it "
                          "\"auto\"", f"{PARAM}.eval_samples")
    effort = hyper.get("reasoning_effort")
    if effort not in (None, "auto", *EFFORTS):
        raise invalid(f"reasoning_effort must be one of {', '.join(EFFORTS)}, not {str(effort)[:40]!r}",
                      f"{PARAM}.reasoning_effort")
    if effort not in (None, "auto", "default"):
        out.notes.append(f"reasoning_effort {effort!r} is ignored: the studio's models have no reasoning-effort "
                         "setting; each completion is up to grpo.max_completion_length tokens (studio.grpo)")
    out.hyperparameters = {"compute_multiplier": multiplier if multiplier is not None else 1.0,
                           "eval_samples": "auto", "reasoning_effort": effort if effort not in (None, "auto")
                           else "default"}
    return out


def _multiplier(value: object) -> float | None:
    if value is None or value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 10:
        raise invalid(f"compute_multiplier must be a number over 0 and at most 10, or \"auto\"; got {value!r}",
                      f"{PARAM}.compute_multiplier")
    return float(value)


def check_fields(plan_: Plan, columns: list[str] | None, file_id: str, param: str) -> None:
    """Every row field the grader reads is one each row of the file has (``columns``; None: not known, as for a
    file uploaded before the fields were recorded, which the run itself then checks)."""
    if columns is None:
        return
    for name, where in plan_.fields.items():
        if name not in columns:
            have = ", ".join(columns) or "no fields besides the prompt"
            raise invalid(f"{{{{item.{name}}}}} names the field '{name}', which not every row of {param} {file_id} "
                          f"has (its rows have: {have})", where)
