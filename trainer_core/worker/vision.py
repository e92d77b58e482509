"""Vision-language SFT glue (worker-only): which processing class a run trains with, image loading, the check that
every row's image tokens fit in max_seq_length, and the collator (TRL's, with image tokens kept out of the loss).

Rows arrive in the one vision shape of ``trainer_core.data.images`` ({"messages": [...image placeholders...],
"images": [paths]}); TRL's SFTTrainer trains them with the processor as its processing class.
"""
from __future__ import annotations

import io
import re
from dataclasses import dataclass, replace
from typing import Any

from PIL import Image
from transformers import ProcessorMixin
from trl.data_utils import prepare_multimodal_messages
from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

from trainer_core.config import TrainConfig

MAX_LISTED = 5  # row numbers named in a warning or error


class VisionDataError(ValueError):
    """Image data the model or the settings cannot train on; the message starts with the field that fixes it."""


def is_vision_rows(rows) -> bool:
    return bool(rows) and "images" in rows[0]


def processing_for(processing, rows: list[dict], cfg: TrainConfig, warn) -> Any:
    """The processing class the run trains with: the processor for image rows, the tokenizer for text rows. A
    vision-language model on text-only data trains as a text model, and says so."""
    is_processor = isinstance(processing, ProcessorMixin)
    if is_vision_rows(rows) and not is_processor:
        raise VisionDataError(f"model_name: {cfg.model_label} is a text model, but the dataset holds images: choose "
                              "a vision-language model, or a dataset without images")
    if is_processor and not is_vision_rows(rows):
        warn(f"{cfg.model_label} is a vision-language model, but the dataset holds no images: it trains as a text "
             "model on the text alone (the vision tower is not used).")
        return processing.tokenizer
    return processing


MAX_IMAGE_PIXELS = 64_000_000  # an 8000 x 8000 photo; past this a file is refused before it is decoded


def load_image(ref: Any) -> Image.Image:
    """An image from a path (already resolved and checked by the data loader), bytes, or an image object; RGB. One
    whose header claims more than MAX_IMAGE_PIXELS is refused (ValueError) before it is decoded: a few bytes could
    otherwise ask for gigabytes."""
    if isinstance(ref, dict):
        ref = ref.get("bytes") or ref.get("path")
    try:
        if isinstance(ref, (bytes, bytearray)):
            image = Image.open(io.BytesIO(ref))
        elif isinstance(ref, str):
            image = Image.open(ref)
        elif isinstance(ref, Image.Image):
            image = ref
        else:
            raise ValueError(f"not an image: {type(ref).__name__}")
    except Image.DecompressionBombError as exc:
        raise ValueError(f"the image is too large to decode ({exc})") from None
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise ValueError(f"the image is {width}×{height} px, more than {MAX_IMAGE_PIXELS:,} pixels: resize it")
    return image.convert("RGB")


def downscale(image: Image.Image, max_side: int) -> Image.Image:
    """The image scaled down so its longest side is ``max_side`` px, keeping its shape (image_max_side; 0 or an
    image already that small: unchanged)."""
    if not max_side or max(image.size) <= max_side:
        return image
    scale = max_side / max(image.size)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.resize(size, Image.Resampling.LANCZOS)


def clean_messages(messages: list[dict]) -> list[dict]:
    """Messages as the chat template expects them: Arrow gives every content part every key (a text part's
    "image" is None); a part keeps only the keys it has."""
    return [{**m, "content": [{k: v for k, v in part.items() if v is not None} for part in m["content"]]}
            if isinstance(m.get("content"), list) else m for m in messages]


def prepared(example: dict, max_side: int = 0) -> dict:
    """One dataset row with its images loaded (scaled down to ``max_side``, the run's image_max_side) and its content
    parts cleaned, for the collator."""
    out = {k: clean_messages(v) if k in ("messages", "prompt", "completion") else v for k, v in example.items()}
    out["images"] = [downscale(load_image(ref), max_side) for ref in example.get("images") or []]
    return out


def training_rows(rows: list[dict], completions_only: bool) -> tuple[list[dict], dict[str, int]]:
    """Rows as SFTTrainer takes them: {"messages", "images"}, or {"prompt", "completion", "images"} split before
    the last assistant turn for completions-only loss (the images stay with the prompt, where they are)."""
    if not completions_only:
        return list(rows), {}
    shaped, dropped = [], 0
    for row in rows:
        messages = row["messages"]
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=0)
        if last == 0:
            dropped += 1
            continue
        shaped.append({"prompt": messages[:last], "completion": [messages[last]], "images": row["images"]})
    return shaped, ({"no prompt before the last assistant turn": dropped} if dropped else {})


def row_length(processor, row: dict, max_side: int = 0) -> int:
    """Tokens of one row as the collator builds it: the chat template with each image expanded by the processor."""
    ids_list, _ = encodings([row], processor, max_side)
    return len(ids_list[0])


def fitting_rows(rows: list[dict], processor, cfg: TrainConfig, warn, log) -> list[dict]:
    """The rows whose whole sequence (text plus every image's tokens) fits in max_seq_length. TRL would truncate
    the others, which cuts an image's token run and fails at step 1 ("Image features and image tokens do not
    match"): they are dropped with one warning naming them, or the run is refused when none fits. Every image is
    opened here, so an unreadable one is found now, with its row."""
    kept, too_long, longest = [], [], 0
    for index, row in enumerate(rows):
        try:
            length = row_length(processor, row, cfg.image_max_side)
        except (OSError, ValueError) as exc:  # PIL's UnidentifiedImageError is an OSError
            raise VisionDataError(f"local_datasets: row {index}: cannot read its image ({exc}): replace or remove "
                                  "the file") from None
        longest = max(longest, length)
        if length <= cfg.max_seq_length:
            kept.append(row)
        else:
            too_long.append(index)
    log(f"Image rows: {len(rows)}, longest {longest} tokens with its images (max_seq_length {cfg.max_seq_length})")
    if too_long and not kept:
        raise VisionDataError(f"max_seq_length: every row is longer than {cfg.max_seq_length} tokens with its images "
                              f"(the longest: {longest}); truncating would cut image tokens. Raise max_seq_length to "
                              f"at least {longest}, or resize the images")
    if too_long:
        listed = ", ".join(str(i) for i in too_long[:MAX_LISTED]) + (" ..." if len(too_long) > MAX_LISTED else "")
        warn(f"Dropped {len(too_long)} of {len(rows)} image rows longer than max_seq_length {cfg.max_seq_length} "
             f"with their images (rows {listed}; the longest has {longest} tokens): truncating would cut image "
             f"tokens. Raise max_seq_length to {longest} to keep them, or resize the images.")
    return kept


@dataclass
class VisionCollator(DataCollatorForVisionLanguageModeling):
    """TRL's vision collator on rows whose images are paths; image tokens are never trained on (the model cannot
    predict an image), like pad tokens."""

    image_token_id: int | None = None
    max_side: int = 0  # the run's image_max_side

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super().torch_call([prepared(example, self.max_side) for example in examples])
        if self.image_token_id is not None:
            batch["labels"][batch["input_ids"] == self.image_token_id] = -100
        return batch


def collator(processor, cfg: TrainConfig) -> VisionCollator:
    return VisionCollator(processor=processor, max_length=cfg.max_seq_length,
                          completion_only_loss=bool(cfg.train_on_completions),
                          image_token_id=getattr(processor, "image_token_id", None), max_side=cfg.image_max_side)


def prepare_run(processing, train_rows: list[dict], eval_rows: list[dict], cfg: TrainConfig, warn, log):
    """(processing class, train rows, eval rows) of a run, after the data is loaded: the processor and only the
    rows that fit for image data; the tokenizer (and a warning) for a vision model on text data."""
    processing = processing_for(processing, train_rows, cfg, warn)
    if not is_vision_rows(train_rows):
        return processing, train_rows, eval_rows
    train_rows = fitting_rows(train_rows, processing, cfg, warn, log)
    eval_rows = fitting_rows(eval_rows, processing, cfg, warn, log) if eval_rows else eval_rows
    return processing, train_rows, eval_rows


def text_tokenizer(processing):
    """The tokenizer inside a processor (samples during training are text prompts), or the tokenizer itself."""
    return processing.tokenizer if isinstance(processing, ProcessorMixin) else processing


def encodings(rows: list[dict], processor, max_side: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """(token ids, trained mask) of each shaped row as the collator builds it, every image expanded to its tokens
    (the preview counts and renders these): completions-only rows train their completion, others every token;
    image tokens never."""
    image_id = getattr(processor, "image_token_id", None)
    ids_list, masks = [], []
    for row in rows:
        example = prepared(row, max_side)
        if "prompt" in example:
            prompt = prepare_multimodal_messages(example["prompt"], images=example["images"])
            whole = prompt + prepare_multimodal_messages(example["completion"])
            start = len(_ids(processor.apply_chat_template(prompt, tokenize=True, return_dict=True,
                                                           add_generation_prompt=True)))
        else:
            whole, start = prepare_multimodal_messages(example["messages"], images=example["images"]), 0
        ids = _ids(processor.apply_chat_template(whole, tokenize=True, return_dict=True))
        ids_list.append(ids)
        masks.append([int(i >= start and token != image_id) for i, token in enumerate(ids)])
    return ids_list, masks


def _ids(out) -> list[int]:
    ids = out["input_ids"]
    return list(ids[0]) if ids and isinstance(ids[0], list) else list(ids)


def collapse_image_runs(text: str, image_token: str) -> str:
    """A run of image tokens as one marker saying how many ('<image> x 16 tokens'), for reading."""
    if not image_token:
        return text
    pattern = re.compile(f"(?:{re.escape(image_token)})+")
    return pattern.sub(lambda m: f"{image_token} × {len(m.group(0)) // len(image_token)} tokens", text)


def readable_row(row, image_token: str):
    """A preview row (trainer_core.data.preview.RenderedRow) with its image-token runs collapsed, and how many images."""
    segments = tuple((collapse_image_runs(text, image_token), trained) for text, trained in row.segments)
    images = sum(text.count(f"{image_token} × ") for text, _ in segments) if image_token else 0
    return replace(row, segments=segments, text="".join(t for t, _ in segments),
                   label=f"{images} image(s)" if images else row.label)
