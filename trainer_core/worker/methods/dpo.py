"""DPO (worker half): TRL's DPOTrainer on prompt/chosen/rejected rows. With LoRA the reference is the base
with the adapter disabled (no second copy); with full fine-tuning TRL keeps a frozen copy."""
from __future__ import annotations

from typing import Any

from trl import DPOConfig, DPOTrainer

from trainer_core.config import TrainConfig
from trainer_core.worker.methods.preference import (PAIR_COLUMNS, as_conversational, common_args, preview, shape_rows,
                                                    TEXT_PROMPTS_AS_CHAT)

__all__ = ["shape_rows", "preview", "build_trainer", "TEXT_PROMPTS_AS_CHAT"]


def build_trainer(cfg: TrainConfig, model, tokenizer, train_ds, eval_ds, args: dict[str, Any], callbacks: list,
                  peft_config) -> DPOTrainer:
    s = cfg.method_settings
    # RPO is DPO plus rpo_alpha x the NLL of the chosen answers: TRL 1.16 has no rpo_alpha field any more (a
    # DPOConfig(rpo_alpha=...) raised TypeError at start) but combines losses, "sft" being that NLL term.
    losses, weights = ([s.loss_type, "sft"], [1.0, s.rpo_alpha]) if s.rpo_alpha else ([s.loss_type], None)
    config = DPOConfig(**common_args(cfg, args), beta=s.beta, loss_type=losses, loss_weights=weights,
                       label_smoothing=s.label_smoothing)
    return DPOTrainer(model=model, args=config, processing_class=tokenizer, peft_config=peft_config,
                      train_dataset=as_conversational(train_ds, tokenizer, PAIR_COLUMNS),
                      eval_dataset=as_conversational(eval_ds, tokenizer, PAIR_COLUMNS), callbacks=callbacks)
