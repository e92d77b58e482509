"""transformers + peft + trl (SFTTrainer): the engine that runs everywhere. Worker-only."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from peft import LoftQConfig, LoraConfig
from transformers import AutoModelForCausalLM, TrainerCallback
from trl import SFTConfig, SFTTrainer

from trainer_core import token_cache
from trainer_core.config import TrainConfig

NAME = "transformers"
EMBEDDING_MODULES = ("embed_tokens", "lm_head")


def load_model(cfg: TrainConfig, model_ref: str, token: str | None):
    kwargs: dict[str, Any] = {"token": token, "trust_remote_code": cfg.trust_remote_code}
    tokenizer = token_cache.load_tokenizer(cfg, model_ref, token)  # the preview loads it the same way
    if cfg.effective_4bit:
        from transformers import BitsAndBytesConfig  # only reachable on CUDA hosts with the gpu extra

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16)
    kwargs["dtype"] = _train_dtype()
    if cfg.gpu_ids and torch.cuda.is_available():
        kwargs["device_map"] = {"": 0}  # CUDA_VISIBLE_DEVICES already narrowed to cfg.gpu_ids
    model = AutoModelForCausalLM.from_pretrained(model_ref, **kwargs)
    if cfg.effective_4bit:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.gradient_checkpointing)
    return model, tokenizer


def _train_dtype() -> torch.dtype:
    if torch.cuda.is_available():
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32  # CPU: fp32 is the fast and exact path


def peft_config(cfg: TrainConfig) -> LoraConfig | None:
    if not cfg.effective_use_lora:
        return None
    modules_to_save = list(EMBEDDING_MODULES) if cfg.training_type == "cpt" and cfg.embedding_learning_rate > 0 else None
    return LoraConfig(
        r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
        target_modules=cfg.effective_target_modules, use_rslora=cfg.use_rslora, bias="none",
        task_type="CAUSAL_LM", modules_to_save=modules_to_save,
        init_lora_weights="loftq" if cfg.use_loftq else True,
        loftq_config=LoftQConfig(loftq_bits=4) if cfg.use_loftq else {})


def to_dataset(rows: list[dict], completions_only: bool) -> Dataset:
    """Rows are {"messages": [...]} or {"text": ...}. For completions-only loss each conversation is
    split into prompt (everything before the last assistant turn) and completion."""
    shaped, _ = token_cache.training_rows(rows, completions_only)
    return Dataset.from_list(shaped)


def pretokenize(ds: Dataset, tokenizer, cfg: TrainConfig, log=print) -> Dataset:
    """``ds`` tokenized the way SFTTrainer would, from the on-disk cache when the same data, tokenizer
    and settings were tokenized before. SFTTrainer then only builds labels, truncates and packs."""
    tokenized, _ = token_cache.tokenize(ds.to_list(), tokenizer, cfg, log=log)
    return tokenized


def build_trainer(cfg: TrainConfig, model, tokenizer, train_ds: Dataset, eval_ds: Dataset | None,
                  output_dir: Path, run_dir: Path, callbacks: list[TrainerCallback], apply_peft: bool = True):
    report_to = []
    if cfg.enable_wandb:
        report_to.append("wandb")
        os.environ.setdefault("WANDB_PROJECT", cfg.wandb_project)
        os.environ.setdefault("WANDB_DIR", str(run_dir))
    if cfg.enable_tensorboard:
        report_to.append("tensorboard")
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(run_dir / cfg.tensorboard_dir)
    on_cuda = torch.cuda.is_available()
    train_ds = pretokenize(train_ds, tokenizer, cfg)
    eval_ds = pretokenize(eval_ds, tokenizer, cfg) if eval_ds is not None else None
    args = SFTConfig(
        output_dir=str(output_dir),
        run_name=cfg.run_name or None,
        num_train_epochs=cfg.num_epochs,
        max_steps=cfg.max_steps if cfg.max_steps > 0 else -1,
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        learning_rate=cfg.learning_rate,
        warmup_steps=cfg.warmup_ratio if cfg.warmup_ratio > 0 else cfg.warmup_steps,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        lr_scheduler_type=cfg.lr_scheduler_type,
        optim=cfg.optim,
        seed=cfg.random_seed,
        data_seed=cfg.random_seed,
        logging_steps=cfg.logging_steps,
        logging_first_step=True,
        save_strategy="steps" if cfg.save_steps > 0 else "no",
        save_steps=cfg.save_steps if cfg.save_steps > 0 else 500,
        eval_strategy="steps" if eval_ds is not None else "no",
        eval_steps=cfg.eval_steps,
        report_to=report_to,
        gradient_checkpointing=cfg.gradient_checkpointing,
        max_length=cfg.max_seq_length,
        packing=cfg.packing,
        packing_strategy=token_cache.packing_strategy(cfg),  # the preview counts packed rows the same way
        dataset_text_field="text",
        completion_only_loss=True if cfg.train_on_completions else None,
        bf16=on_cuda and torch.cuda.is_bf16_supported(),
        fp16=on_cuda and not torch.cuda.is_bf16_supported(),
        use_cpu=not on_cuda,
        dataloader_num_workers=0,
        disable_tqdm=True,  # progress goes through our events; tqdm bars only bloat worker.log
        dataset_num_proc=None,
    )
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds, processing_class=tokenizer,
        peft_config=peft_config(cfg) if apply_peft else None, callbacks=callbacks)
    if cfg.training_type == "cpt" and cfg.embedding_learning_rate > 0:
        # Built after SFTTrainer wrapped the model with PEFT, so it sees the trainable parameters;
        # Trainer.create_optimizer keeps an optimizer that is already set.
        trainer.optimizer = embedding_aware_optimizer(trainer.model, cfg)
    return trainer


def embedding_aware_optimizer(model, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW where embeddings and lm_head learn at ``embedding_learning_rate`` (continued pretraining)."""
    embed, rest = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (embed if any(m in name for m in EMBEDDING_MODULES) else rest).append(param)
    groups = [{"params": rest, "lr": cfg.learning_rate}]
    if embed:
        groups.append({"params": embed, "lr": cfg.embedding_learning_rate})
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
