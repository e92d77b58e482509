"""Samples during training: greedy answers to the run's sample prompts at chosen steps. Worker-only (torch).

When: every ``sample_every_steps`` steps; with 0, at each evaluation, or at each checkpoint save when the
run has no eval set; always once at the end (not after a cancel). How: the prompt is rendered exactly as the
training rows are (a chat run: the tokenizer's chat template with the run's system prompt and
``add_generation_prompt``; a raw-text run: the prompt as text), then greedy decoding with a fixed seed, the
model in eval mode under ``torch.no_grad`` and back in train mode after, the RNG state restored (sampling
never changes what training draws next). Each answer is one ``SampleEvent`` with the degenerations
``samples_check`` finds in it. Only rank 0 samples; the other ranks go on to their next collective and wait
there (the DDP module underneath is called directly, so no collective runs while rank 0 generates).
"""
from __future__ import annotations

import time
from typing import Callable

import torch
from transformers import GenerationConfig, TrainerCallback

from trainer_core import samples_check
from trainer_core.config import SAMPLE_PROMPTS_MAX, TrainConfig, sample_prompts_of
from trainer_core.promptsets import PromptSetError
from trainer_core.protocol import control, events as ev

SEED = 1234  # greedy decoding draws nothing; the seed pins a model whose forward draws even in eval mode
BUDGET_S = 120.0  # the most one sampling step may take, all prompts together (generation's max_time)


class Sampler:
    """Renders the run's sample prompts once, then answers them at the steps ``SampleCallback`` picks."""

    def __init__(self, prompts: tuple[str, ...], tokenizer, cfg: TrainConfig, chat: bool,
                 emit: Callable[[ev.Event], None], warn: Callable[[str], None], log: Callable[[str], None]):
        self.prompts = prompts
        self.tokenizer = tokenizer
        self.emit, self.warn, self.log = emit, warn, log
        self.max_new_tokens = cfg.sample_max_new_tokens
        self.inputs = [render(tokenizer, prompt, cfg.system_prompt, chat) for prompt in prompts]
        special = getattr(tokenizer, "all_special_tokens", []) or []
        self.special_tokens = tuple(t for t in special if isinstance(t, str))
        self.last_step: int | None = None
        self.broken = False

    def take(self, model, step: int) -> None:
        """Answer every prompt at ``step`` (once per step) and emit one event each."""
        if self.broken or step == self.last_step:
            return
        self.last_step = step
        started = time.monotonic()
        try:
            answers = self._generate(model, started)
        except Exception as exc:  # noqa: BLE001 - an optional extra: training goes on without it
            self.broken = True
            self.warn(f"Samples at step {step} failed ({type(exc).__name__}: {str(exc)[:300]}); training goes on "
                      "without samples.")
            return
        for index, (prompt, (text, new_tokens, _)) in enumerate(zip(self.prompts, answers)):
            flags = samples_check.check(text, self.special_tokens)
            self.emit(ev.SampleEvent(step=step, index=index, prompt=prompt, text=text, new_tokens=new_tokens,
                                     flags=flags))
        complete = sum(1 for *_, cut in answers if not cut)
        if complete < len(self.prompts):
            self.warn(f"Samples at step {step} reached their time limit of {BUDGET_S:.0f} s: {complete} of "
                      f"{len(self.prompts)} answers are complete (the rest are cut short or missing). Lower "
                      "sample_max_new_tokens or use fewer sample prompts.")
        self.log(f"samples at step {step}: {len(answers)} answers in {time.monotonic() - started:.1f} s")

    def _generate(self, model, started: float) -> list[tuple[str, int, bool]]:
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        answers = []
        try:
            # fork_rng: the seed set here is undone after, so training's own random stream is untouched
            with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                torch.manual_seed(SEED)
                for ids in self.inputs:
                    left = BUDGET_S - (time.monotonic() - started)
                    if left <= 0:
                        break
                    answers.append(self._answer(model, ids, device, left))
        finally:
            if was_training:
                model.train()
        return answers

    def _answer(self, model, ids: list[int], device, max_time: float) -> tuple[str, int, bool]:
        """(text, new tokens, cut short by the time limit)."""
        stops = stop_ids(model, self.tokenizer)
        config = GenerationConfig(max_new_tokens=self.max_new_tokens, do_sample=False, num_beams=1, use_cache=True,
                                  eos_token_id=sorted(stops) or None, pad_token_id=self.tokenizer.pad_token_id,
                                  max_time=max_time)
        input_ids = torch.tensor([ids], device=device)
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config)
        new = out[0, len(ids):].tolist()
        cut = len(new) < self.max_new_tokens and not (new and new[-1] in stops)
        while new and new[-1] in stops:  # the token that ended the answer is not part of it
            new.pop()
        return self.tokenizer.decode(new, skip_special_tokens=False), len(new), cut


def render(tokenizer, prompt: str, system_prompt: str, chat: bool) -> list[int]:
    """The prompt's token ids as the run's training rows are made (see token_cache.encode)."""
    if not chat:
        return list(tokenizer(text=prompt)["input_ids"])
    messages = ([{"role": "system", "content": system_prompt.strip()}] if system_prompt.strip() else [])
    messages.append({"role": "user", "content": prompt})
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, add_generation_prompt=True)
    return list(out["input_ids"])


def stop_ids(model, tokenizer) -> set[int]:
    """The token ids that end an answer: the model's generation config's eos ids, else the tokenizer's."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    ids = eos if isinstance(eos, (list, tuple)) else [eos]
    return {int(i) for i in ids if i is not None}


class SampleCallback(TrainerCallback):
    """Picks the steps to sample at; rank 0 only (the worker adds it there)."""

    def __init__(self, sampler: Sampler, every: int, has_eval: bool, cancelled: Callable[[], bool]):
        self.sampler = sampler
        self.every = every
        self.has_eval = has_eval
        self.cancelled = cancelled

    def on_step_end(self, args, state, control_, model=None, **kwargs):
        if self.every and state.global_step % self.every == 0 and not self.cancelled():
            self.sampler.take(model, state.global_step)

    def on_evaluate(self, args, state, control_, model=None, **kwargs):
        if not self.every and self.has_eval and not self.cancelled():
            self.sampler.take(model, state.global_step)

    def on_save(self, args, state, control_, model=None, **kwargs):
        if not self.every and not self.has_eval and not self.cancelled():
            self.sampler.take(model, state.global_step)

    def on_train_end(self, args, state, control_, model=None, **kwargs):
        if not self.cancelled():
            self.sampler.take(model, state.global_step)


def make_callback(cfg: TrainConfig, tokenizer, chat: bool, has_eval: bool, sharded: bool, worker
                  ) -> SampleCallback | None:
    """The sampling callback of this run, or None (no prompts, a rank other than 0, or an FSDP-sharded model,
    whose weights only all ranks together can run)."""
    try:
        prompts = sample_prompts_of(cfg)
    except PromptSetError as exc:  # the set was deleted or broken after the run was validated
        worker.warn(f"No samples during training: {exc}")
        return None
    if not prompts or worker.rank != 0:
        return None
    if len(prompts) > SAMPLE_PROMPTS_MAX:  # the set grew after the run was checked (the Playground adds to sets)
        what = f"The prompt set {cfg.sample_prompt_set.strip()!r}" if cfg.sample_prompt_set.strip() else "The run"
        worker.warn(f"{what} now has {len(prompts)} prompts: samples use the first {SAMPLE_PROMPTS_MAX} (each is "
                    "generated at every sampling step).")
        prompts = prompts[:SAMPLE_PROMPTS_MAX]
    if sharded:
        worker.warn("No samples during training: the model is sharded across processes (FSDP), and sampling "
                    "runs on one process.")
        return None
    try:
        sampler = Sampler(prompts, tokenizer, cfg, chat, worker.events.emit, worker.warn, worker.log)
    except Exception as exc:  # noqa: BLE001 - e.g. a chat template refusing a role: samples are optional
        worker.warn(f"No samples during training: the sample prompts cannot be rendered ({type(exc).__name__}: "
                    f"{str(exc)[:300]}).")
        return None
    def cancelled() -> bool:  # under torchrun, what the ranks agreed on at this step
        action = worker.agreed_action if worker.distributed else worker.requested()
        return action is control.Action.CANCEL

    return SampleCallback(sampler, cfg.sample_every_steps, has_eval, cancelled)
