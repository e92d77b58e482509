"""Samples during training: greedy answers to the run's sample prompts at chosen steps. Worker-only (torch).

When: every ``sample_every_steps`` steps; with 0, at each evaluation, or at each checkpoint save when the
run has no eval set; always once at the end (not after a cancel). How: the prompt is rendered exactly as the
training rows are (a chat run: the tokenizer's chat template with the run's system prompt and
``add_generation_prompt``; a raw-text run: the prompt as text), then greedy decoding with a fixed seed, the
model in eval mode under ``torch.no_grad`` and back in train mode after, the RNG state restored (sampling
never changes what training draws next). Each answer is one ``SampleEvent`` with the degenerations
``samples_check`` finds in it. A vision run's prompt may show an image (``sample_images``, one per prompt in order):
that prompt is rendered by the model's processor as training renders an image row (its chat template over an image
part and the text, the image expanded to its tokens) and answered with the image; a thumbnail of it is written once
to ``samples/images/<index>.png`` in the run folder, where Live and Run details show it above the answers. Only
rank 0 samples; the other ranks go on to their next collective and wait there (the DDP module underneath is called directly, so no collective runs while rank 0 generates).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import torch
from transformers import GenerationConfig, TrainerCallback

from trainer_core.evaluation import samples_check
from trainer_core.config import SAMPLE_PROMPTS_MAX, TrainConfig, sample_prompts_of
from trainer_core.config.promptsets import PromptSetError
from trainer_core.protocol import control, events as ev, paths

SEED = 1234  # greedy decoding draws nothing; the seed pins a model whose forward draws even in eval mode
BUDGET_S = 120.0  # the most one sampling step may take, all prompts together (generation's max_time)
IMAGES = "samples/images"  # in the run folder: the thumbnail of each sample prompt's image, <index>.png
THUMBNAIL_PX = 256


class Sampler:
    """Renders the run's sample prompts once, then answers them at the steps ``SampleCallback`` picks."""

    def __init__(self, prompts: tuple[str, ...], tokenizer, cfg: TrainConfig, chat: bool,
                 emit: Callable[[ev.Event], None], warn: Callable[[str], None], log: Callable[[str], None],
                 processor=None, images: tuple = ()):
        self.prompts = prompts
        self.tokenizer = tokenizer
        self.emit, self.warn, self.log = emit, warn, log
        self.max_new_tokens = cfg.sample_max_new_tokens
        # (token ids, the processor's other tensors: pixel values...) of each prompt; an image prompt through the
        # processor, the others through the tokenizer as before
        self.inputs = [render_image(processor, prompt, image, cfg.system_prompt) if image is not None
                       else (render(tokenizer, prompt, cfg.system_prompt, chat), {})
                       for prompt, image in zip(prompts, images or (None,) * len(prompts))]
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
                for ids, extra in self.inputs:
                    left = BUDGET_S - (time.monotonic() - started)
                    if left <= 0:
                        break
                    answers.append(self._answer(model, ids, device, left, extra))
        finally:
            if was_training:
                model.train()
        return answers

    def _answer(self, model, ids: list[int], device, max_time: float, extra: dict | None = None
                ) -> tuple[str, int, bool]:
        """(text, new tokens, cut short by the time limit); ``extra``: an image prompt's pixel values and the
        like, in the model's dtype."""
        stops = stop_ids(model, self.tokenizer)
        config = GenerationConfig(max_new_tokens=self.max_new_tokens, do_sample=False, num_beams=1, use_cache=True,
                                  eos_token_id=sorted(stops) or None, pad_token_id=self.tokenizer.pad_token_id,
                                  max_time=max_time)
        input_ids = torch.tensor([ids], device=device)
        dtype = next(model.parameters()).dtype
        tensors = {k: v.to(device, dtype=dtype) if v.is_floating_point() else v.to(device)
                   for k, v in (extra or {}).items()}
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config,
                             **tensors)
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


def render_image(processor, prompt: str, image, system_prompt: str) -> tuple[list[int], dict]:
    """(token ids, the processor's other tensors) of a prompt shown with ``image``, as a vision run renders its
    rows: the processor's chat template over an image part and the text, the image expanded to its tokens."""
    messages = ([{"role": "system", "content": [{"type": "text", "text": system_prompt.strip()}]}]
                if system_prompt.strip() else [])
    messages.append({"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]})
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    out = processor(text=text, images=[image], return_tensors="pt")
    ids = out["input_ids"][0].tolist()
    return ids, {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")}


def sample_images(cfg: TrainConfig, count: int, run_dir: Path, warn) -> tuple:
    """The images of the first ``count`` sample prompts (None for a text-only prompt), each checked again under
    the allowed roots (config.yaml may have been edited, a file swapped for a link since the run was checked),
    opened, and saved as a thumbnail in the run folder; a missing or unreadable one is a warning and a text-only
    prompt."""
    from trainer_core.worker.vision import downscale, load_image

    names = [str(v) if isinstance(v, str) else "" for v in (cfg.sample_images or [])][:count]
    images: list = []
    for index, name in enumerate(names + [""] * (count - len(names))):
        if not name.strip():
            images.append(None)
            continue
        try:
            found = paths.resolve_inside(Path(name).expanduser(), paths.allowed_data_roots())
            image = downscale(load_image(str(found)), cfg.image_max_side)  # as the run's training rows are
        except (paths.UnsafePathError, OSError, ValueError) as exc:
            warn(f"sample_images: image {index + 1} ({Path(name).name}) cannot be shown ({exc}): prompt {index + 1} "
                 "is sampled without it")
            images.append(None)
            continue
        thumb = image.copy()
        thumb.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX))
        folder = run_dir / IMAGES
        folder.mkdir(parents=True, exist_ok=True)
        thumb.save(folder / f"{index}.png", format="PNG")
        images.append(image)
    return tuple(images)


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
    processor, images = None, ()
    if any(isinstance(v, str) and v.strip() for v in (cfg.sample_images or [])):
        processor, images = _image_prompts(cfg, len(prompts), worker)
    try:
        sampler = Sampler(prompts, tokenizer, cfg, chat, worker.events.emit, worker.warn, worker.log, processor,
                          images)
    except Exception as exc:  # noqa: BLE001 - e.g. a chat template refusing a role: samples are optional
        worker.warn(f"No samples during training: the sample prompts cannot be rendered ({type(exc).__name__}: "
                    f"{str(exc)[:300]}).")
        return None

    def cancelled() -> bool:  # under torchrun, what the ranks agreed on at this step
        action = worker.agreed_action if worker.distributed else worker.requested()
        return action is control.Action.CANCEL

    return SampleCallback(sampler, cfg.sample_every_steps, has_eval, cancelled)


def _image_prompts(cfg: TrainConfig, count: int, worker) -> tuple:
    """(the model's processor, the prompts' images) for a vision run's image prompts; (None, ()) with a warning
    for a model that reads text only (its prompts are sampled as text)."""
    from transformers import ProcessorMixin

    from trainer_core.worker.model_files import resolve_model
    from trainer_core.worker.model_resolver import load_processor

    try:
        processor = load_processor(resolve_model(cfg, log=worker.log), cfg, os.environ.get("HF_TOKEN") or None)
    except (OSError, ValueError) as exc:
        processor, reason = None, f"its processor cannot be loaded ({type(exc).__name__})"
    else:
        reason = "it reads text only"
    if not isinstance(processor, ProcessorMixin) or getattr(processor, "image_processor", None) is None:
        worker.warn(f"sample_images: {cfg.model_label} cannot be shown images ({reason}): the sample prompts are "
                    "answered as text")
        return None, ()
    return processor, sample_images(cfg, count, worker.run_dir, worker.warn)
