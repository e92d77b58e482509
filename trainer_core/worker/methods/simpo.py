"""SimPO (worker half): TRL's CPOTrainer with loss_type "simpo" (length-normalised rewards and a target
margin, no reference model); ``sft_weight`` > 0 is CPO-SimPO (``trl.experimental.cpo`` in TRL 1.16)."""
from __future__ import annotations

from typing import Any

from trainer_core.config import TrainConfig
from trainer_core.worker.methods.preference import (PAIR_COLUMNS, as_conversational, common_args, experimental,
                                                    preview, shape_rows, TEXT_PROMPTS_AS_CHAT)

__all__ = ["shape_rows", "preview", "build_trainer", "TEXT_PROMPTS_AS_CHAT"]


def build_trainer(cfg: TrainConfig, model, tokenizer, train_ds, eval_ds, args: dict[str, Any], callbacks: list,
                  peft_config):
    config_cls, trainer_cls = experimental("cpo")
    s = cfg.method_settings
    config = config_cls(**common_args(cfg, args), loss_type="simpo", beta=s.beta, simpo_gamma=s.gamma,
                        cpo_alpha=s.sft_weight)
    return trainer_cls(model=model, args=config, processing_class=tokenizer, peft_config=peft_config,
                       train_dataset=as_conversational(train_ds, tokenizer, PAIR_COLUMNS),
                       eval_dataset=as_conversational(eval_ds, tokenizer, PAIR_COLUMNS), callbacks=callbacks)
