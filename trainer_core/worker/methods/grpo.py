"""GRPO (worker half): TRL's GRPOTrainer with the run's reward functions.

Rewards are the built-ins (trainer_core.rewards.builtin, their parameters bound), the user's own Python
functions loaded from the copies made at submit (``rewards/`` in the run folder, hashed there: the file
the run used, not the one edited since), and reward models (sequence classifiers TRL scores with). Each is
named after its spec, so TRL logs ``rewards/<name>/mean`` and ``/std``, which the open metrics carry. Every
function's calls are guarded (trainer_core.rewards.guard): a reward that raises, exits, returns the wrong thing
or too many NaN/inf scores fails the run with an error naming it; a few non-finite scores are a warning.
Every ``sample_every`` steps a few of the step's completions, with each reward's score, become sample
events (Live and Run details show them; ``db rebuild`` restores them).
"""
from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from typing import Any, Callable

from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from trainer_core.config import TrainConfig
from trainer_core.protocol import events as ev
from trainer_core.rewards import files
from trainer_core.rewards.builtin import BUILTINS, completion_text
from trainer_core.rewards.guard import guard, run_reward, trap_exit
from trainer_core.rewards.spec import RewardSpec, parse_rewards
from trainer_core.worker.methods.preference import preview  # noqa: F401 - GRPO's preview: the prompts

SAMPLES_PER_STEP = 4


def shape_rows(rows: list[dict], cfg: TrainConfig) -> tuple[list[dict], dict[str, int]]:
    return rows, {}


def _named(fn: Callable, name: str) -> Callable:
    @functools.wraps(fn)
    def reward(prompts, completions, **kwargs):
        return fn(prompts, completions, **kwargs)

    reward.__name__ = name  # TRL names the metric after the function: rewards/<name>/mean
    return reward


def load_function(path: Path, spec: RewardSpec) -> Callable:
    """``spec.function`` from the Python file at ``path``, named after the spec. Runs the user's module: only
    in the worker and in the reward check's child (trainer_core.rewards.spec says who may start either)."""
    trap_exit()  # before the module runs: an `from os import _exit` in it binds the trap
    module_spec = importlib.util.spec_from_file_location(f"studio_reward_{spec.name}", path)
    module = importlib.util.module_from_spec(module_spec)
    run_reward(spec.name, module_spec.loader.exec_module, module)  # what loading raises (or exits) names the reward
    fn = getattr(module, spec.function, None)
    if not callable(fn):
        raise TypeError(f"{spec.python} defines no function {spec.function}")
    return _named(fn, spec.name)


def load_python_reward(run_dir: Path, spec: RewardSpec) -> Callable:
    """The user's function, from the run folder's copy (checked against the hash recorded at submit)."""
    return load_function(files.checked_copy(run_dir, spec), spec)


def reward_functions(specs: list[RewardSpec], run_dir: Path, token: str | None) -> list:
    out: list = []
    for spec in specs:
        if spec.kind == "python":
            out.append(load_python_reward(run_dir, spec))
        elif spec.kind == "model":
            from transformers import AutoModelForSequenceClassification

            out.append(AutoModelForSequenceClassification.from_pretrained(spec.model, num_labels=1, token=token))
        else:
            out.append(_named(functools.partial(BUILTINS[spec.kind], **spec.params), spec.name))
    return out


def guarded(specs: list[RewardSpec], functions: list, warn: Callable[[str], None]) -> list:
    """The reward functions as TRL calls them, each guarded; reward models (TRL scores them itself) as they are."""
    return [fn if spec.kind == "model" else guard(fn, spec.name, warn) for spec, fn in zip(specs, functions)]


def grpo_args(cfg: TrainConfig, args: dict[str, Any], weights: list[float]) -> GRPOConfig:
    s = cfg.method_settings
    return GRPOConfig(
        **args, num_generations=s.num_generations, max_completion_length=s.max_completion_length,
        temperature=s.temperature, top_p=s.top_p, beta=s.beta, loss_type=s.loss_type, scale_rewards=s.scale_rewards,
        reward_weights=weights, use_vllm=s.use_vllm, vllm_mode="colocate", log_completions=False,
        mask_truncated_completions=False)


def drop_long_prompts(ds, tokenizer, limit: int):
    """(rows whose prompt, as the model sees it, fits ``max_prompt_length``; how many were left out)."""
    def fits(row: dict) -> bool:
        prompt = row["prompt"]
        if isinstance(prompt, list):
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) else ids
        else:
            ids = tokenizer(prompt)["input_ids"]
        return len(ids) <= limit

    kept = ds.filter(fits)
    return kept, len(ds) - len(kept)


class CompletionSamples(TrainerCallback):
    """Every ``every`` steps, the newest completions of the step with each reward's score, as sample events."""

    def __init__(self, trainer: GRPOTrainer, emit: Callable[[ev.Event], None], every: int):
        self.trainer, self.emit, self.every = trainer, emit, every

    def on_log(self, args, state, control_, logs=None, **kwargs):
        if not self.every or state.global_step % self.every or not logs or "reward" not in logs:
            return
        logged = getattr(self.trainer, "_logs", None) or {}
        prompts, completions = list(logged.get("prompt", ())), list(logged.get("completion", ()))
        rewards = {name: list(values) for name, values in (logged.get("rewards") or {}).items()}
        for index in range(max(0, len(completions) - SAMPLES_PER_STEP), len(completions)):
            scores = {name: values[index] for name, values in rewards.items() if index < len(values)}
            self.emit(ev.SampleEvent(step=state.global_step, index=index % SAMPLES_PER_STEP,
                                     prompt=completion_text(prompts[index])[-2000:] if index < len(prompts) else "",
                                     text=completion_text(completions[index])[:4000],
                                     flags={f"reward:{name}": _score(value) for name, value in scores.items()}))


def _score(value: Any) -> str:
    return "none" if value is None or value != value else f"{float(value):.4g}"


def build_trainer(cfg: TrainConfig, model, tokenizer, train_ds, eval_ds, args: dict[str, Any], callbacks: list,
                  peft_config) -> GRPOTrainer:
    s = cfg.method_settings
    specs, _ = parse_rewards(s.rewards)  # validated at submit; parsed again for the objects
    run_dir = Path(args["output_dir"]).parent
    emit = next((c.emit for c in callbacks if hasattr(c, "emit")), None)
    warn = next((c.warn for c in callbacks if hasattr(c, "warn")), print)
    train_ds, left_out = drop_long_prompts(train_ds, tokenizer, s.max_prompt_length)
    if left_out:
        warn(f"Left out {left_out:,} training prompts longer than grpo.max_prompt_length ({s.max_prompt_length} "
             "tokens); raise it, or shorten those prompts.")
    if eval_ds is not None:
        eval_ds, _ = drop_long_prompts(eval_ds, tokenizer, s.max_prompt_length)
    rewards = guarded(specs, reward_functions(specs, run_dir, os.environ.get("HF_TOKEN") or None), warn)
    trainer = GRPOTrainer(model=model, reward_funcs=rewards,
                          args=grpo_args(cfg, args, [spec.weight for spec in specs]), train_dataset=train_ds,
                          eval_dataset=eval_ds if eval_ds is not None and len(eval_ds) else None,
                          processing_class=tokenizer, peft_config=peft_config, callbacks=callbacks)
    if emit is not None and s.sample_every:
        trainer.add_callback(CompletionSamples(trainer, emit, s.sample_every))
    return trainer
