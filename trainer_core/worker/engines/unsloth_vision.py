"""Unsloth's FastVisionModel path for vision-language models (CUDA + the ``gpu`` extra). Worker-only; imported by
unsloth_engine, after ``unsloth``.

The API as Unsloth documents it (unsloth.ai/docs/basics/vision-fine-tuning) and as unsloth/models/loader.py,
unsloth/models/vision.py and unsloth_zoo/vision_utils.py define it: FastVisionModel.from_pretrained, get_peft_model
with the four finetune_* switches, for_training, then TRL's SFTTrainer with UnslothVisionDataCollator and an
SFTConfig that leaves the dataset to the collator (remove_unused_columns=False, dataset_text_field="",
dataset_kwargs={"skip_prepare_dataset": True}). The studio's data loading and its pre-start checks (image
placeholders, rows that would cut an image's tokens) run before this, as on the transformers engine.
"""
from __future__ import annotations

import functools
import gc

import torch
from unsloth import FastVisionModel
from unsloth.trainer import UnslothVisionDataCollator
from trl import SFTConfig, SFTTrainer
from trl.data_utils import prepare_multimodal_messages

from trainer_core.config import TrainConfig
from trainer_core.config.limits import DEFAULT_TARGET_MODULES
from trainer_core.worker import vision
from trainer_core.worker.engines import UnslothCannotLoad

# What Unsloth raises for an architecture it cannot patch or load (its loader's errors are RuntimeError and
# ValueError; a model it does not know deeper down fails as one of the others). OSError (missing files, no access)
# is not here: the worker reports it as a model that cannot be found. CUDA out of memory is a RuntimeError, re-raised.
CANNOT_LOAD = (RuntimeError, ValueError, NotImplementedError, TypeError, KeyError, AttributeError)


def load_model(cfg: TrainConfig, model_ref: str, token: str | None):
    """(model with its LoRA adapters, or the full model, processor). Raises UnslothCannotLoad when Unsloth cannot
    load the model, so the worker falls back to the transformers engine."""
    full = not cfg.effective_use_lora
    checkpointing = "unsloth" if cfg.gradient_checkpointing else False  # Unsloth's offloading variant
    try:
        model, processor = FastVisionModel.from_pretrained(
            model_name=model_ref, max_seq_length=cfg.max_seq_length,
            load_in_4bit=cfg.effective_4bit,  # Unsloth's default is True: always said
            dtype=None, token=token, trust_remote_code=cfg.trust_remote_code, full_finetuning=full,
            use_gradient_checkpointing=checkpointing,
            use_exact_model_name=True,  # the model asked for, not Unsloth's -bnb-4bit twin (a download)
            float32_mixed_precision=True if full else None)  # fp32 master weights, as the text engine's
    except torch.OutOfMemoryError:
        raise
    except CANNOT_LOAD as exc:
        gc.collect()
        torch.cuda.empty_cache()  # what the failed load allocated, before the transformers engine loads
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise UnslothCannotLoad(f"Unsloth cannot load {cfg.model_label} as a vision-language model ({reason}): "
                                "training with the transformers engine instead.") from exc
    tokenizer = vision.text_tokenizer(processor)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if full:  # Unsloth trains every weight (full_finetuning above); get_peft_model would do nothing
        return model, processor
    saved = list(cfg.method_spec.saved_modules(cfg))
    model = FastVisionModel.get_peft_model(
        model,
        finetune_vision_layers=cfg.finetune_vision_layers, finetune_language_layers=cfg.finetune_language_layers,
        finetune_attention_modules=cfg.finetune_attention_modules, finetune_mlp_modules=cfg.finetune_mlp_modules,
        target_modules=explicit_targets(cfg),
        r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout, bias="none",
        use_gradient_checkpointing=checkpointing, random_state=cfg.random_seed, use_rslora=cfg.use_rslora,
        modules_to_save=saved or None,
        init_lora_weights="loftq" if cfg.use_loftq else True,
        loftq_config={"loftq_bits": 4, "loftq_iter": 1} if cfg.use_loftq else {})
    return model, processor


def explicit_targets(cfg: TrainConfig) -> list[str] | None:
    """None (Unsloth picks the layers from the four switches, by its own names for each family's vision tower) unless
    the run lists modules other than the default ones; a list is kept only where the switches also select."""
    listed = list(cfg.target_modules or [])
    return None if not listed or listed == DEFAULT_TARGET_MODULES else listed


def collator_row(example: dict, max_side: int = 0) -> dict:
    """One dataset row as UnslothVisionDataCollator reads it: images opened and scaled down to image_max_side (the
    studio's downscale, the one its pre-start token count used), empty Arrow keys dropped; a completions-only row's
    prompt carries its images in its placeholders (the collator's prompt/completion path reads them only there, and
    rounds their sides to its patch grid as Qwen-VL's processor does: a tiling processor may then count a row's image
    tokens a little differently from the pre-start check)."""
    row = vision.prepared(example, max_side)
    if "prompt" in row:
        row["prompt"] = prepare_multimodal_messages(row["prompt"], images=row["images"])
    return row


class StudioVisionCollator(UnslothVisionDataCollator):
    """Unsloth's collator, with the EOS token kept in the loss where the pad token is the EOS token (a tokenizer that
    had no pad token): Unsloth leaves padding out of the loss by token id, which would leave out every EOS too, and
    the model would never learn to stop. TRL's collator (the transformers engine) masks padding by position."""

    def __init__(self, model, processor, **kwargs):
        super().__init__(model, processor, **kwargs)
        tokenizer = vision.text_tokenizer(processor)
        self.eos_as_pad = tokenizer.eos_token_id if tokenizer.pad_token_id == tokenizer.eos_token_id else None

    def __call__(self, examples):
        batch = super().__call__(examples)
        if self.eos_as_pad is not None:
            train_eos(batch, self.eos_as_pad)
        return batch


def train_eos(batch: dict, eos_id: int) -> None:
    """EOS tokens back in ``batch["labels"]`` where they are real tokens (attended) from the first trained token on:
    every turn's end for whole conversations, the answer's end for completions-only rows (a prompt's EOS stays out)."""
    labels, ids = batch["labels"], batch["input_ids"]
    started = (labels != -100).cumsum(dim=1) > 0
    keep = (ids == eos_id) & (batch["attention_mask"] == 1) & started
    labels[keep] = ids[keep]


def collator(model, processor, cfg: TrainConfig) -> StudioVisionCollator:
    return StudioVisionCollator(
        model, processor, max_seq_length=cfg.max_seq_length,
        formatting_func=functools.partial(collator_row, max_side=cfg.image_max_side),
        # image_max_side is the collator's resize with resize_dimension "max": the same rule as the studio's downscale
        # (longest side, shrink only, shape kept), which collator_row has already applied, so it changes nothing;
        # "max" (0: images as they are) keeps the default ("min": the vision tower's image_size) from shrinking them
        resize=cfg.image_max_side or "max", resize_dimension="max",
        completion_only_loss=bool(cfg.train_on_completions))


def sft_config(cfg: TrainConfig, args: dict) -> SFTConfig:
    """The shared TrainingArguments plus the settings Unsloth documents for vision: the collator builds every batch
    from the raw rows, so SFTTrainer neither drops their columns nor tokenizes them."""
    return SFTConfig(**args, max_length=cfg.max_seq_length, remove_unused_columns=False, dataset_text_field="",
                     dataset_kwargs={"skip_prepare_dataset": True},
                     dataset_num_proc=1)  # Unsloth's patched config otherwise forks a pool per CPU core


def build_trainer(cfg: TrainConfig, model, processor, train_ds, eval_ds, args: dict, callbacks: list) -> SFTTrainer:
    FastVisionModel.for_training(model, use_gradient_checkpointing=cfg.gradient_checkpointing)
    return SFTTrainer(model=model, args=sft_config(cfg, args), train_dataset=train_ds, eval_dataset=eval_ds,
                      processing_class=processor, data_collator=collator(model, processor, cfg), callbacks=callbacks)
