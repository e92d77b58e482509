"""KTO (worker half): TRL's KTOTrainer on prompt/completion/label rows (pairs arrive unpaired by the loader).
With LoRA the reference is the base with the adapter disabled."""
from __future__ import annotations

from typing import Any

from trl import KTOConfig, KTOTrainer

from trainer_core.config import TrainConfig
from trainer_core.worker.methods.preference import (KTO_COLUMNS, as_conversational, common_args, preview, shape_rows,
                                                    TEXT_PROMPTS_AS_CHAT)

__all__ = ["shape_rows", "preview", "build_trainer", "TEXT_PROMPTS_AS_CHAT"]


def build_trainer(cfg: TrainConfig, model, tokenizer, train_ds, eval_ds, args: dict[str, Any], callbacks: list,
                  peft_config) -> KTOTrainer:
    s = cfg.method_settings
    config = KTOConfig(**common_args(cfg, args), beta=s.beta, desirable_weight=s.desirable_weight,
                       undesirable_weight=s.undesirable_weight, loss_type=s.loss_type)
    return KTOTrainer(model=model, args=config, processing_class=tokenizer, peft_config=peft_config,
                      train_dataset=as_conversational(train_ds, tokenizer, KTO_COLUMNS),
                      eval_dataset=as_conversational(eval_ds, tokenizer, KTO_COLUMNS), callbacks=callbacks)
