"""GRPO's settings: generation, the policy loss, the rewards and the tools (``grpo: {...}`` in YAML)."""
from __future__ import annotations

from dataclasses import dataclass

from trainer_core.methods.settings import setting

GRPO_LOSSES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo")


@dataclass
class GRPOSettings:
    rewards: list = setting([], "The reward functions, each with a weight: built-ins such as "
                                "{type: length, target: 20}, {type: format, preset: think_answer}, "
                                "{type: answer_match, column: answer}, your own {python: FILE, function: NAME}, "
                                "or {model: FOLDER} (a reward model). docs/methods.md lists every parameter.")
    num_generations: int = setting(4, "Completions sampled per prompt (a group): their rewards are compared with "
                                      "each other. batch_size x gradient_accumulation_steps x processes must be "
                                      "a multiple of it.", low=2, high=256)
    max_prompt_length: int = setting(256, "Longest prompt in tokens: longer prompts are left out (counted).",
                                     low=1, high=131072)
    max_completion_length: int = setting(64, "Longest completion in tokens: longer ones are cut (clipped).",
                                         low=1, high=131072)
    temperature: float = setting(1.0, "Sampling temperature of the completions: a group needs different "
                                      "completions to learn from.", low=0.0, high=10.0, low_open=True)
    top_p: float = setting(1.0, "Nucleus sampling of the completions.", low=0.0, high=1.0, low_open=True)
    beta: float = setting(0.0, "KL penalty against the reference model (0: none, and no reference pass: TRL's "
                               "default).", low=0.0, high=100.0)
    loss_type: str = setting("dapo", "The policy loss: dapo (TRL's default, no length bias), grpo, dr_grpo, "
                                     "bnpo or cispo.", choices=GRPO_LOSSES)
    scale_rewards: str = setting("group", "Divide advantages by the reward std of the group, the batch, or not "
                                          "at all (none: Dr. GRPO).", choices=("group", "batch", "none"))
    use_vllm: bool = setting(False, "Generate with vLLM in the training process (TRL's colocate mode; CUDA "
                                    "and the vllm extra).")
    tools: list = setting([], "Python tool files the model may call during its rollouts (an agent trained with "
                              "rewards): every public function of each file is a tool, or pick some with "
                              "{python: FILE, functions: [NAME]}. Each tool needs a docstring with Args: and typed "
                              "parameters. The rewards see the whole trajectory (calls, results, answer). "
                              "docs/tool-calling.md.")
    max_tool_turns: int = setting(3, "With tools: at most this many rounds of tool calls per completion (call, "
                                     "result, continue); tool results count toward max_completion_length and are "
                                     "not trained on.", low=1, high=64)
    sample_every: int = setting(10, "Every this many steps, a few completions with each reward's score are "
                                    "kept and shown on Live and Run details (0: never).", low=0, high=1_000_000)
