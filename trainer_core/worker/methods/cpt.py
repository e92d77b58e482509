"""Continued pretraining (worker half): SFT's trainer on raw text ("bfd_split" packing, from the spec), with
embeddings and lm_head in an optimizer group of their own when embedding_learning_rate is set."""
from __future__ import annotations

from typing import Any

from transformers import Trainer, TrainingArguments

from trainer_core.config import TrainConfig
from trainer_core.methods.cpt import EMBEDDING_MODULES
from trainer_core.worker.methods import sft

shape_rows = sft.shape_rows  # raw text rows pass through as {"text"}


def build_trainer(cfg: TrainConfig, model, tokenizer, train_ds, eval_ds, args: dict[str, Any], callbacks: list,
                  peft_config):
    trainer = sft.build_trainer(cfg, model, tokenizer, train_ds, eval_ds, args, callbacks, peft_config)
    if cfg.embedding_learning_rate > 0:
        # Built after SFTTrainer wrapped the model with PEFT, so it sees the trainable parameters;
        # Trainer.create_optimizer keeps an optimizer that is already set.
        trainer.optimizer = embedding_aware_optimizer(trainer.model, trainer.args, cfg.embedding_learning_rate)
    return trainer


def embedding_aware_optimizer(model, args: TrainingArguments, embedding_learning_rate: float):
    """The optimizer ``args.optim`` names (the Trainer's own choice of class and settings, so adamw_8bit
    stays 8-bit), with embeddings and lm_head in a group of their own at ``embedding_learning_rate``."""
    optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    embed, rest = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (embed if any(m in name for m in EMBEDDING_MODULES) else rest).append(param)
    # weight decay per group, as Trainer.create_optimizer does (its kwargs carry lr, betas, eps, ...)
    groups = [{"params": rest, "lr": args.learning_rate, "weight_decay": args.weight_decay}]
    if embed:
        groups.append({"params": embed, "lr": embedding_learning_rate, "weight_decay": args.weight_decay})
    return optimizer_cls(groups, **kwargs)
