"""GRPO (dashboard half): reinforcement learning from reward functions on prompts.

Validation catches before start what fails late in TRL: a group size that does not divide the generation
batch, prompt + completion longer than the context, rewards that cannot be loaded (an unknown built-in, a
bad parameter, a Python file outside the allowed roots or without the function, a missing reward model),
tool files that cannot be tools (outside the roots, no tool in them, a tool without the docstring and type hints
its schema is built from), vLLM asked for without CUDA or the vllm extra.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from trainer_core.host import hardware, parallel
from trainer_core.methods.base import TRAINER_METRICS, MethodSpec, MetricSpec
from trainer_core.methods.grpo_settings import GRPOSettings
from trainer_core.protocol import paths
from trainer_core.protocol.errors import FieldError
from trainer_core.rewards import files, tools
from trainer_core.rewards.spec import RewardSpec, needs_admin, parse_rewards

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")


def rewards_of(cfg: Any) -> list[RewardSpec]:
    """A run's reward functions: none for a run of another method."""
    settings = cfg.method_settings
    return parse_rewards(settings.rewards)[0] if isinstance(settings, GRPOSettings) else []


def tools_of(cfg: Any) -> list[tools.ToolFile]:
    """A run's tool files: none for a run of another method."""
    settings = cfg.method_settings
    return tools.parse_tools(settings.tools)[0] if isinstance(settings, GRPOSettings) else []


def _model_problem(spec: RewardSpec) -> str | None:
    candidate = Path(spec.model).expanduser()
    if candidate.is_absolute() or spec.model.startswith(".") or candidate.exists():
        try:
            folder = paths.resolve_inside(candidate, paths.allowed_data_roots())
        except paths.UnsafePathError as exc:
            return f"{exc}: a reward model folder must be under the allowed roots"
        if not (folder / "config.json").is_file():
            return f"{spec.model} has no config.json: give a model folder (e.g. a reward run's adapter or model)"
        return None
    if not _HUB_ID.fullmatch(spec.model):
        return f"{spec.model!r} is neither a model folder nor a hub id such as owner/name"
    return None


def generation_batch(cfg: Any) -> int:
    return parallel.global_batch(cfg, parallel.process_count(cfg))


def validate(cfg: Any) -> list[FieldError]:
    s: GRPOSettings = cfg.method_settings
    specs, reward_problems = parse_rewards(s.rewards)
    problems = [FieldError(field, message) for field, message in reward_problems]
    if not specs and not reward_problems:
        problems.append(FieldError("grpo.rewards", "GRPO learns from rewards: add at least one, e.g. "
                                                   "[{type: length, target: 20}]"))
    for index, spec in enumerate(specs):
        if spec.kind == "python":
            _, problem = files.source_problem(spec)
            if problem:
                problems.append(FieldError(f"grpo.rewards[{index}].python", problem))
        elif spec.kind == "model":
            problem = _model_problem(spec)
            if problem:
                problems.append(FieldError(f"grpo.rewards[{index}].model", problem))
    tool_files, tool_problems = tools.parse_tools(s.tools)
    problems += [FieldError(field, message) for field, message in tool_problems + tools.problems_of(tool_files)]
    if tool_files and s.use_vllm:
        problems.append(FieldError("grpo.use_vllm", "tools run with the trainer's own generate here: turn use_vllm "
                                                    "off, or leave out grpo.tools"))
    batch = generation_batch(cfg)
    if batch % s.num_generations:
        problems.append(FieldError("grpo.num_generations", (
            f"{s.num_generations} completions per prompt do not divide the generation batch of {batch} "
            "(batch_size x gradient_accumulation_steps x processes): make the batch a multiple of it, e.g. "
            f"batch_size {s.num_generations}")))
    if s.max_prompt_length + s.max_completion_length > cfg.max_seq_length:
        problems.append(FieldError("grpo.max_completion_length", (
            f"max_prompt_length {s.max_prompt_length} + max_completion_length {s.max_completion_length} is over "
            f"max_seq_length {cfg.max_seq_length}: lower one of them, or raise max_seq_length")))
    if s.use_vllm and not (hardware.cuda_available() and hardware.has_module("vllm")):
        problems.append(FieldError("grpo.use_vllm", "vLLM generation needs an NVIDIA GPU and the vllm extra "
                                                    "(pip install -e '.[vllm]'): turn it off to generate with the "
                                                    "trainer's own generate"))
    if cfg.packing:
        problems.append(FieldError("packing", "GRPO generates whole completions per prompt: turn packing off"))
    return problems


def activations(cfg: Any) -> float:
    """Each prompt is held num_generations times (its completions) through the policy's forward pass."""
    return float(cfg.method_settings.num_generations)


def metrics_for(config: dict) -> tuple[MetricSpec, ...]:
    """The specs of a stored GRPO config: one reward chart and tile per reward function, by its name."""
    section = config.get("grpo") if isinstance(config.get("grpo"), dict) else {}
    specs, _ = parse_rewards(section.get("rewards") or [])
    return metric_specs([spec.name for spec in specs], with_tools=bool(tools.parse_tools(section.get("tools"))[0]))


TOOL_METRICS = (
    MetricSpec("tools/call_frequency", "Tool calls per completion", axis="calls", tile=True),
    MetricSpec("tools/failure_frequency", "Tool calls that failed", axis="share of calls", format=".0%", tile=True),
)


def metric_specs(reward_names: list[str], with_tools: bool = False) -> tuple[MetricSpec, ...]:
    per_reward = tuple(MetricSpec(f"rewards/{name}/mean", f"Reward: {name}", axis="reward", tile=True)
                       for name in reward_names)
    return (
        MetricSpec("reward", "Reward (weighted total)", axis="reward", tile=True),
        MetricSpec("reward_std", "Reward spread within groups", axis="reward std"),
        *per_reward,
        MetricSpec("frac_reward_zero_std", "Groups with no reward spread", axis="share of groups", format=".0%",
                   tile=True),
        MetricSpec("completions/mean_length", "Completion length (mean)", axis="tokens", tile=True),
        MetricSpec("completions/clipped_ratio", "Completions cut at max length", axis="share", format=".0%"),
        *(TOOL_METRICS if with_tools else ()),
        MetricSpec("kl", "KL to the reference", axis="KL"),
        MetricSpec("entropy", "Entropy", axis="nats"),
        *TRAINER_METRICS[:4],
    )


ADMIN_REASON = ("a custom Python reward runs its code on this host, so only an admin may start a run with one; use "
                "the built-in rewards, or ask an admin to start it.")


TOOLS_REASON = ("grpo.tools run their code on this host during training, so only an admin may start a run with "
                "them; leave out grpo.tools, or ask an admin to start it.")


def admin_reasons(cfg: Any) -> list[str]:
    return [ADMIN_REASON] * needs_admin(rewards_of(cfg)) + [TOOLS_REASON] * bool(tools_of(cfg))


def job_files(cfg: Any, run_dir: Path) -> None:
    files.snapshot(rewards_of(cfg), run_dir)
    tools.snapshot(tools_of(cfg), run_dir)


SPEC = MethodSpec(
    name="grpo", label="GRPO (reinforcement learning from rewards)",
    help="Group Relative Policy Optimization: the model answers each prompt several times, reward functions "
         "score the answers, and it learns to prefer the better ones of each group. No answers needed in the "
         "data, only prompts (and any columns the rewards read, e.g. answer).",
    data_shapes=("prompts",),
    data_fix="use a prompt column (text or messages), or chat rows (the last assistant turn is left out and "
             "kept as the 'answer' column)",
    validate=validate, activation_factor=4.0, activations=activations, metric_specs=metric_specs([]),
    metrics_for=metrics_for, settings=GRPOSettings, admin_reasons=admin_reasons, job_files=job_files)
