"""Eval of a vision-language model on image rows (worker-only: torch, transformers). Each test row is rendered as
training renders it (worker/vision.py: the processor's chat template over the turns with their image parts, every
image expanded to its tokens by the processor) and answered greedily WITH its image. One row at a time: rows with
images differ in length and image count, and one at a time keeps each answer exactly what the row alone gives (no
padding); on a CPU the tiny models take well under a second a row."""
from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image
from transformers import set_seed

from trainer_core.evaluation import vision as eval_vision
from trainer_core.evaluation.samples import Sample
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.worker.vision import clean_messages, downscale, load_image


class ImageUnreadable(ValueError):
    """A test row's image that the processor cannot open; the message names the row and the fix."""


def pictures(sample: Sample, max_side: int = 0) -> list[Image.Image]:
    """The row's images, scaled down to ``max_side`` (the spec's image_max_side: the run's) as training saw them."""
    try:
        return [downscale(load_image(ref), max_side) for ref in sample.images]
    except (OSError, ValueError) as exc:  # PIL's UnidentifiedImageError is an OSError
        raise ImageUnreadable(f"data: test row {sample.index}: cannot read its image ({exc}): replace or remove the "
                              "file") from None


def inputs(processor, sample: Sample, device: str, answer: str | None = None, dtype=None, max_side: int = 0):
    """The processor's tensors of a row's prompt (ending with the assistant's turn opening), or of prompt + answer;
    pixel values in the model's ``dtype`` (bfloat16 on a GPU: not every vision tower casts them itself); images
    scaled down to ``max_side``."""
    turns = clean_messages(sample.prompt)
    if answer is None:
        text = processor.apply_chat_template(turns, add_generation_prompt=True)
    else:
        text = processor.apply_chat_template(turns + [{"role": "assistant", "content": [{"type": "text",
                                                                                          "text": answer}]}])
    images = pictures(sample, max_side)
    encoded = processor(text=text, images=images or None, return_tensors="pt")
    return encoded.to(device, dtype=dtype) if dtype is not None else encoded.to(device)  # casts floats only


def context_of(model) -> int | None:
    config = model.config
    text = getattr(config, "text_config", None) or config
    return getattr(text, "max_position_embeddings", None)


def prompt_length(processor, sample: Sample, max_side: int = 0) -> int:
    return int(inputs(processor, sample, "cpu", max_side=max_side)["input_ids"].shape[1])


def generate(model, processor, batch: list[Sample], spec: EvalSpec, device: str) -> list[str]:
    """Greedy answers (unless the spec sets a temperature), one row at a time, each with its images."""
    set_seed(spec.seed)
    sampling = spec.temperature > 0
    tokenizer = processor.tokenizer
    options = dict(max_new_tokens=spec.max_new_tokens, do_sample=sampling, repetition_penalty=spec.repetition_penalty,
                   pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    if sampling:
        options.update(temperature=spec.temperature, top_p=spec.top_p, top_k=spec.top_k or None)
    else:
        options.update(temperature=None, top_p=None, top_k=None)
    answers = []
    for sample in batch:
        encoded = inputs(processor, sample, device, dtype=model.dtype, max_side=spec.image_max_side)
        with torch.inference_mode():
            out = model.generate(**encoded, **options)
        new = out[0, encoded["input_ids"].shape[1]:]
        answers.append(tokenizer.decode(new, skip_special_tokens=True).strip())
    return answers


def answer_loss(model, processor, sample: Sample, device: str, max_side: int = 0) -> tuple[float | None, int]:
    """(mean negative log-likelihood of the reference answer's tokens given the prompt and its images, their count):
    the tokens a completions-only vision run trains on (the answer and its end of turn; never image tokens)."""
    prompt = inputs(processor, sample, device, dtype=model.dtype, max_side=max_side)
    whole = inputs(processor, sample, device, answer=sample.reference, dtype=model.dtype, max_side=max_side)
    ids = whole["input_ids"]
    start = prompt["input_ids"].shape[1]
    if ids.shape[1] <= start or not torch.equal(ids[0, :start], prompt["input_ids"][0]):
        return None, 0  # the template does not continue the prompt with the answer: no loss to state
    with torch.inference_mode():
        logits = model(**whole).logits[0, start - 1:-1].float()
    target = ids[0, start:]
    loss = float(F.cross_entropy(logits, target, reduction="mean"))
    return (loss if math.isfinite(loss) else None), int(target.numel())


def save_thumbnail(sample: Sample, job_dir: Path) -> str | None:
    """The row's first image as a PNG of at most THUMBNAIL_PX a side in the job's ``images`` folder; its path
    relative to the job folder (predictions.jsonl's ``image``), None for a row without images."""
    if not sample.images:
        return None
    image = load_image(sample.images[0])
    image.thumbnail((eval_vision.THUMBNAIL_PX, eval_vision.THUMBNAIL_PX))
    folder = job_dir / eval_vision.THUMBNAILS
    folder.mkdir(exist_ok=True)
    name = f"{sample.index}.png"
    image.save(folder / name, format="PNG")
    return f"{eval_vision.THUMBNAILS}/{name}"
