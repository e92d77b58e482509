"""Continued pretraining (dashboard half): raw text, packed without cutting, optionally with the embeddings
and lm_head trained in full at their own learning rate."""
from __future__ import annotations

from typing import Any

from trainer_core.methods.base import MethodSpec
from trainer_core.protocol.errors import FieldError

EMBEDDING_MODULES = ("embed_tokens", "lm_head")  # trained and saved in full when embedding_learning_rate > 0


def validate(cfg: Any) -> list[FieldError]:
    if cfg.format_type not in ("auto", "text"):
        return [FieldError("format_type", "continued pretraining trains on raw text: choose 'text' or 'auto'")]
    return []


def saved_modules(cfg: Any) -> tuple[str, ...]:
    """With an embedding learning rate, embed_tokens and lm_head are trained in full beside the adapter."""
    return EMBEDDING_MODULES if cfg.embedding_learning_rate > 0 else ()


SPEC = MethodSpec(
    name="cpt",
    label="Continued pretraining",
    help="Teach a base model a domain's text: raw text packed into full-length rows (long texts are split "
         "across rows, never cut), embeddings and lm_head optionally trained at embedding_learning_rate.",
    data_shapes=("text",),
    data_fix="use a dataset with a 'text' column, or choose method sft",
    section=("embedding_learning_rate",),
    validate=validate,
    saved_modules=saved_modules,
    preview_fields=(),
    packing_strategy="bfd_split",  # TRL's "bfd" would cut long texts; "bfd_split" carries them over
)
