"""Supervised fine-tuning (dashboard half): TRL's SFTTrainer on conversations or raw text."""
from __future__ import annotations

from trainer_core.methods.base import MethodSpec

SPEC = MethodSpec(
    name="sft",
    label="Supervised fine-tuning",
    help="Learn to answer like the dataset: chat conversations (the loss on every token, or on the assistant "
         "replies only with train_on_completions) or raw text.",
    data_shapes=("chat", "text"),
    data_fix="use chat or text data",
    section=("train_on_completions",),
    # the completions split decides which tokens are trained, so it changes what the preview shows
    preview_fields=("train_on_completions",),
)
