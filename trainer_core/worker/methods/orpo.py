"""ORPO (worker half): SFT on chosen answers plus an odds-ratio penalty on rejected ones, no reference
model (``trl.experimental.orpo`` in TRL 1.16)."""
from __future__ import annotations

from typing import Any

from trainer_core.config import TrainConfig
from trainer_core.worker.methods.preference import (PAIR_COLUMNS, as_conversational, common_args, experimental,
                                                    preview, shape_rows, TEXT_PROMPTS_AS_CHAT)

__all__ = ["shape_rows", "preview", "build_trainer", "TEXT_PROMPTS_AS_CHAT"]


def build_trainer(cfg: TrainConfig, model, tokenizer, train_ds, eval_ds, args: dict[str, Any], callbacks: list,
                  peft_config):
    config_cls, trainer_cls = experimental("orpo")
    s = cfg.method_settings
    config = config_cls(**common_args(cfg, args), beta=s.beta)
    return trainer_cls(model=model, args=config, processing_class=tokenizer, peft_config=peft_config,
                       train_dataset=as_conversational(train_ds, tokenizer, PAIR_COLUMNS),
                       eval_dataset=as_conversational(eval_ds, tokenizer, PAIR_COLUMNS), callbacks=callbacks)
