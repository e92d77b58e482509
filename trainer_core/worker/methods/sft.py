"""Supervised fine-tuning (worker half): TRL's SFTConfig and SFTTrainer on rows tokenized by token_cache."""
from __future__ import annotations

from typing import Any

from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from trainer_core.config import TrainConfig
from trainer_core.worker import token_cache, vision


def shape_rows(rows: list[dict], cfg: TrainConfig) -> tuple[list[dict], dict[str, int]]:
    """Chat rows stay {"messages"} ({"prompt", "completion"} when training on completions); text stays {"text"};
    image rows keep their "images" beside either."""
    if vision.is_vision_rows(rows):
        return vision.training_rows(rows, cfg.train_on_completions)
    return token_cache.training_rows(rows, cfg.train_on_completions)


def sft_args(cfg: TrainConfig, args: dict[str, Any]) -> SFTConfig:
    return SFTConfig(
        **args,
        max_length=cfg.max_seq_length,
        packing=cfg.packing,
        packing_strategy=token_cache.packing_strategy(cfg),  # the preview counts packed rows the same way
        dataset_text_field="text",
        completion_only_loss=True if cfg.train_on_completions else None,
        # Rows arrive tokenized (token_cache); what SFTTrainer still maps is cheap. One process, said
        # explicitly: Unsloth's patched config otherwise forks a pool per CPU core, in every rank.
        dataset_num_proc=1,
    )


def pretokenize(ds: Dataset, tokenizer, cfg: TrainConfig, log=print) -> Dataset:
    """``ds`` tokenized the way SFTTrainer would, from the on-disk cache when the same data, tokenizer
    and settings were tokenized before. SFTTrainer then only builds labels, truncates and packs."""
    tokenized, _ = token_cache.tokenize(ds.to_list(), tokenizer, cfg, log=log)
    return tokenized


def build_trainer(cfg: TrainConfig, model, tokenizer, train_ds: Dataset, eval_ds: Dataset | None,
                  args: dict[str, Any], callbacks: list, peft_config) -> SFTTrainer:
    if "images" in train_ds.column_names:  # tokenized per batch by the processor, with the images
        return SFTTrainer(model=model, args=sft_args(cfg, args), train_dataset=train_ds, eval_dataset=eval_ds,
                          processing_class=tokenizer, data_collator=vision.collator(tokenizer, cfg),
                          peft_config=peft_config, callbacks=callbacks)
    train_ds = pretokenize(train_ds, tokenizer, cfg)
    eval_ds = pretokenize(eval_ds, tokenizer, cfg) if eval_ds is not None else None
    return SFTTrainer(model=model, args=sft_args(cfg, args), train_dataset=train_ds, eval_dataset=eval_ds,
                      processing_class=tokenizer, peft_config=peft_config, callbacks=callbacks)
