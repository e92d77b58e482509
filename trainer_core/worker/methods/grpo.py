"""GRPO (worker half): TRL's GRPOTrainer with the run's reward functions.

Rewards are the built-ins (trainer_core.rewards.builtin, their parameters bound), the user's own Python
functions loaded from the copies made at submit (``rewards/`` in the run folder, hashed there: the file
the run used, not the one edited since), and reward models (sequence classifiers TRL scores with). Each is
named after its spec, so TRL logs ``rewards/<name>/mean`` and ``/std``, which the open metrics carry. Every
function's calls are guarded (trainer_core.rewards.guard): a reward that raises, exits, returns the wrong thing
or too many NaN/inf scores fails the run with an error naming it; a few non-finite scores are a warning.
Every ``sample_every`` steps a few of the step's completions, with each reward's score, become sample
events (Live and Run details show them; ``db rebuild`` restores them).

With ``grpo.tools`` the model calls the run's tool functions during its rollouts (TRL's ``tools=``, at most
``max_tool_turns`` rounds): loaded from the copies made at submit (hash checked), each call guarded (a time limit;
what a tool raises, or a hang, is an error result the model sees and one warning naming the tool, not a dead run).
TRL masks the tool results' tokens out of the loss (its tool_mask) and passes the rewards the whole trajectory (the
completion's messages: calls, results, answer); a sample carries the trajectory's turns.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Callable

from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from trainer_core.config import TrainConfig
from trainer_core.protocol import events as ev
from trainer_core.rewards import files, tools
from trainer_core.rewards.builtin import BUILTINS, completion_text
from trainer_core.rewards.guard import guard, guard_tool, run_reward, trap_exit
from trainer_core.rewards.spec import RewardSpec, parse_rewards
from trainer_core.worker import serve_tools, tool_template
from trainer_core.worker.methods.preference import preview  # noqa: F401 - GRPO's preview: the prompts

SAMPLES_PER_STEP = 4
TURN_TEXT = 2000  # characters of one turn kept in a sample (a tool may return a whole page)
MAX_TURNS = 32


def shape_rows(rows: list[dict], cfg: TrainConfig) -> tuple[list[dict], dict[str, int]]:
    """With tools, a text prompt becomes a user turn: TRL runs tools only in conversations."""
    if not cfg.method_settings.tools:
        return rows, {}
    return [{**row, "prompt": [{"role": "user", "content": row["prompt"]}]} if isinstance(row.get("prompt"), str)
            else row for row in rows], {}


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


def load_tools(run_dir: Path, warn: Callable[[str], None]) -> list[Callable]:
    """The run's tools from the run folder's copies (hash checked), each guarded. Runs the user's modules: worker
    only (trainer_core.methods.grpo says who may start such a run)."""
    trap_exit()  # before the modules run: an `from os import _exit` in one binds the trap
    loaded = []
    for index, (copy, names) in enumerate(tools.checked_copies(run_dir)):
        module_spec = importlib.util.spec_from_file_location(f"studio_tools_{index}", copy)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:  # noqa: BLE001 - user code: the run cannot start without its tools; say which file
            raise RuntimeError(f"grpo.tools[{index}]: loading the tool file raised {type(exc).__name__}: "
                               f"{str(exc)[:300]}") from exc
        for name in names:
            fn = getattr(module, name, None)
            if not callable(fn):
                raise RuntimeError(f"grpo.tools[{index}]: the tool file defines no function {name}")
            loaded.append(guard_tool(fn, name, warn))
    return loaded


def tool_chat_template(tokenizer, cfg: TrainConfig) -> str:
    """Make the tokenizer show the tools and read the model's calls back (the Hermes tool template on a model whose
    own template ignores tools); what the worker log says it chose."""
    label = tool_template.use(tokenizer, cfg)
    if getattr(tokenizer, "response_template", None) is None and serve_tools.renders_hermes_calls(tokenizer):
        tokenizer.response_template = serve_tools.response_template(tokenizer)  # else TRL knows the template, or says
    return label


def grpo_args(cfg: TrainConfig, args: dict[str, Any], weights: list[float]) -> GRPOConfig:
    s = cfg.method_settings
    return GRPOConfig(max_tool_calling_iterations=s.max_tool_turns if s.tools else None,
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
            turns = trajectory(completions[index])
            final = turns[-1]["content"] if turns and turns[-1]["role"] == "assistant" else ""
            self.emit(ev.SampleEvent(step=state.global_step, index=index % SAMPLES_PER_STEP,
                                     prompt=completion_text(prompts[index])[-2000:] if index < len(prompts) else "",
                                     text=(final or completion_text(completions[index]))[:4000],
                                     flags={f"reward:{name}": _score(value) for name, value in scores.items()},
                                     turns=turns))


def trajectory(completion: Any) -> list[dict]:
    """A conversational completion with tool calls as its turns: the model's words and calls (name, arguments as
    JSON text), each tool's result (none for a call whose result would not fit max_completion_length). [] for a
    completion without a call (its text says it all)."""
    if not isinstance(completion, list) or not any(isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls"))
                                                   for m in completion):
        return []
    turns = []
    for message in completion[:MAX_TURNS]:
        content = completion_text(message.get("content", ""))[:TURN_TEXT]
        if message.get("role") == "tool":
            turns.append({"role": "tool", "name": str(message.get("name", ""))[:64], "content": content})
            continue
        calls = []
        for call in message.get("tool_calls") or []:
            function = call.get("function", call) if isinstance(call, dict) else {}
            arguments = function.get("arguments", {})
            calls.append({"name": str(function.get("name", ""))[:64],
                          "arguments": (arguments if isinstance(arguments, str) else json.dumps(arguments))[:TURN_TEXT]})
        turns.append({"role": "assistant", "content": content, "calls": calls})
    return turns


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
    tool_functions = load_tools(run_dir, warn) if s.tools else None
    if tool_functions:
        log = next((c.log for c in callbacks if hasattr(c, "log")), print)
        log(f"GRPO tools: {', '.join(fn.__name__ for fn in tool_functions)}; chat template: "
            f"{tool_chat_template(tokenizer, cfg)}")
    trainer = GRPOTrainer(model=model, reward_funcs=rewards, tools=tool_functions,
                          args=grpo_args(cfg, args, [spec.weight for spec in specs]), train_dataset=train_ds,
                          eval_dataset=eval_ds if eval_ds is not None and len(eval_ds) else None,
                          processing_class=tokenizer, peft_config=peft_config, callbacks=callbacks)
    if emit is not None and s.sample_every:
        trainer.add_callback(CompletionSamples(trainer, emit, s.sample_every))
    return trainer
