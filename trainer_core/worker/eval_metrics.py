"""The eval worker's two metrics for preference and RL runs (issue 19). Worker-only: imports torch.

``preference_accuracy`` on a held-out pair (prompt, chosen, rejected): each side's sequence log-probability
given the prompt, over the answer's tokens only, tokenized as the preference trainers tokenize a side (the
chat template over prompt + answer, the prompt's tokens masked: ``worker.methods.preference``). For a LoRA
adapter (a dpo/orpo/simpo run) the score of a side is DPO's implicit reward without its beta,
``logp_tuned - logp_base``, the base being the same model with the adapter disabled (peft's
``disable_adapter``: no second copy); the pair counts when reward(chosen) > reward(rejected). A model with no
reference in memory (the base model of a baseline, or full fine-tuned weights) is scored by its plain log-prob
margin, logp(chosen) > logp(rejected): "how often it prefers the chosen answer", which is what the baseline
comparison reads. (Scaling by beta would not change which side wins; the margin is reported unscaled.)

``reward``: the GRPO run's reward functions, built by its worker half (``worker.methods.grpo``; a Python
reward is the hash-checked copy in that run's folder), called as GRPOTrainer calls them,
``fn(prompts, completions, **columns)`` with conversational prompts and completions, on the eval's answers.
A reward that cannot be loaded or raises is one warning naming it; its metric and the weighted total are
left out, the eval goes on.
"""
from __future__ import annotations

import math
import os
from typing import Callable

import torch

from trainer_core.specs import model_source
from trainer_core.evaluation.scoring import weighted_total
from trainer_core.methods import grpo
from trainer_core.protocol import paths
from trainer_core.rewards.spec import RewardSpec
from trainer_core.worker.methods.grpo import reward_functions
# The preference trainers' own split of a side into prompt and answer ids (the preview uses it too).
from trainer_core.worker.methods.preference import _ids as side_ids


# ---------------------------------------------------------------------- preference_accuracy
def pair_lengths(tokenizer, prompt: list[dict], chosen: list[dict], rejected: list[dict]) -> int:
    """The longer side's tokens (prompt + answer), for the context check."""
    return max(sum(map(len, side_ids(tokenizer, prompt, side))) for side in (chosen, rejected))


def sequence_logp(model, tokenizer, prompt: list[dict], answer: list[dict], device: str) -> float:
    """log p(answer | prompt): the sum over the answer's tokens."""
    prompt_ids, answer_ids = side_ids(tokenizer, prompt, answer)
    ids = torch.tensor([prompt_ids + answer_ids], device=device)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()
    targets = ids[0, len(prompt_ids):]
    return float(torch.log_softmax(logits, dim=-1).gather(1, targets[:, None]).sum())


def has_reference(model) -> bool:
    """Whether the model is a peft model whose adapter can be switched off (the base is then its reference)."""
    return callable(getattr(model, "disable_adapter", None)) and hasattr(model, "peft_config")


def prefers(model, tokenizer, sample, device: str) -> tuple[float | None, float | None, dict]:
    """(1.0 when chosen wins else 0.0, the margin, the log-probs) for one pair; (None, None, ...) when a
    log-prob is not finite (no comparison)."""
    logp = {side: sequence_logp(model, tokenizer, sample.prompt, getattr(sample, side), device)
            for side in ("chosen", "rejected")}
    details = {f"logp_{side}": value for side, value in logp.items()}
    reward = dict(logp)
    if has_reference(model):
        with model.disable_adapter():
            for side in ("chosen", "rejected"):
                ref = sequence_logp(model, tokenizer, sample.prompt, getattr(sample, side), device)
                details[f"ref_logp_{side}"] = ref
                reward[side] -= ref
    margin = reward["chosen"] - reward["rejected"]
    details = {key: value if math.isfinite(value) else None for key, value in details.items()}
    if not math.isfinite(margin):
        return None, None, details
    return (1.0 if margin > 0 else 0.0), margin, details


# ---------------------------------------------------------------------- reward
class ModelReward:
    """A reward model scored as GRPOTrainer scores one: prompt + completion through the reward model's chat
    template and tokenizer (right-padded), the first logit."""

    def __init__(self, model, spec: RewardSpec, token: str | None):
        from transformers import AutoTokenizer

        self.model = model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model, token=token)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id

    def __call__(self, prompts, completions, **_):
        texts = [self.tokenizer.apply_chat_template(p + c, tokenize=False) for p, c in zip(prompts, completions)]
        inputs = self.tokenizer(texts, return_tensors="pt", padding=True, padding_side="right",
                                add_special_tokens=False)
        with torch.inference_mode():
            return self.model(**inputs).logits[:, 0].float().tolist()


class RewardScorer:
    """The reward functions of GRPO run ``run_id``, scoring batches of answers; ``failed``: the rewards left out."""

    def __init__(self, run_id: str, warn: Callable[[str], None]):
        self.warn = warn
        self.specs = grpo.rewards_of(model_source.run_config(run_id))
        self.weights = {spec.name: spec.weight for spec in self.specs}
        self.failed: set[str] = set()
        self.functions: dict[str, Callable] = {}
        token = os.environ.get("HF_TOKEN") or None
        for spec in self.specs:
            try:
                fn = reward_functions([spec], paths.run_dir(run_id), token)[0]
                self.functions[spec.name] = ModelReward(fn, spec, token) if spec.kind == "model" else fn
            except Exception as exc:  # noqa: BLE001 - user code and model loading: a warning, not a failed eval
                self._fail(spec.name, exc, "could not be loaded")

    def score(self, samples: list, answers: list[str]) -> list[tuple[float | None, dict]]:
        """(weighted total, {name: value}) per answer, from the rewards that have not failed."""
        prompts = [s.prompt for s in samples]
        completions = [[{"role": "assistant", "content": answer}] for answer in answers]
        keys = dict.fromkeys(k for s in samples for k in s.columns)
        columns = {k: [s.columns.get(k) for s in samples] for k in keys}
        values: list[dict] = [{} for _ in samples]
        for name, fn in list(self.functions.items()):
            try:
                scores = _checked(fn(prompts=prompts, completions=completions, **columns), len(samples))
            except Exception as exc:  # noqa: BLE001 - the user's function: a warning naming it, the eval goes on
                self._fail(name, exc, "raised")
                continue
            for row, score in zip(values, scores):
                row[name] = score
        return [(weighted_total(row, self.weights), row) for row in values]

    def _fail(self, name: str, exc: BaseException, what: str) -> None:
        self.failed.add(name)
        self.functions.pop(name, None)
        self.warn(f"Reward {name} {what} ({type(exc).__name__}: {exc}): reward/{name} and the weighted total "
                  "reward are left out of this eval; the other metrics are unaffected")


def _checked(scores, count: int) -> list[float | None]:
    """A reward's output as floats or None (a non-finite value is None); TypeError/ValueError when it is not one
    number or None per answer."""
    scores = list(scores)
    if len(scores) != count:
        raise ValueError(f"returned {len(scores)} values for {count} completions")
    out: list[float | None] = []
    for value in scores:
        if value is None:
            out.append(None)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(float(value) if math.isfinite(value) else None)
        else:
            raise TypeError(f"returned {type(value).__name__} {str(value)[:40]!r}: a reward is a number or None")
    return out
