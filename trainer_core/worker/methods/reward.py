"""Reward model (worker half): TRL's RewardTrainer on pairs; the model is loaded as a one-label sequence
classifier (the spec's model_class), so its score head is new and trained with the adapter."""
from __future__ import annotations

from typing import Any

from trl import RewardConfig, RewardTrainer

from trainer_core.config import TrainConfig
from trainer_core.worker.methods.preference import (PAIR_COLUMNS, as_conversational, common_args, preview, shape_rows,
                                                    TEXT_PROMPTS_AS_CHAT)

__all__ = ["shape_rows", "preview", "build_trainer", "TEXT_PROMPTS_AS_CHAT"]


def build_trainer(cfg: TrainConfig, model, tokenizer, train_ds, eval_ds, args: dict[str, Any], callbacks: list,
                  peft_config) -> RewardTrainer:
    s = cfg.method_settings
    if model.config.pad_token_id is None:  # the classifier reads the score at the last non-pad token
        model.config.pad_token_id = tokenizer.pad_token_id
    if peft_config is not None:
        peft_config.task_type = "SEQ_CLS"  # keeps the new score head trainable and saved with the adapter
    config = RewardConfig(**common_args(cfg, args),
                          center_rewards_coefficient=s.center_rewards_coefficient or None)
    return RewardTrainer(model=model, args=config, processing_class=tokenizer, peft_config=peft_config,
                         train_dataset=as_conversational(train_ds, tokenizer, PAIR_COLUMNS),
                         eval_dataset=as_conversational(eval_ds, tokenizer, PAIR_COLUMNS), callbacks=callbacks)
