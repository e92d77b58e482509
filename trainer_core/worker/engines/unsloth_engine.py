"""Unsloth's FastLanguageModel path (CUDA + the ``gpu`` extra), and its FastVisionModel path for vision-language
models (unsloth_vision). Worker-only.

``unsloth`` must be imported before transformers/trl so its patches apply; the worker imports
this module before anything else from the ML stack when this engine is chosen.
"""
from __future__ import annotations

import unsloth  # noqa: F401  (import order matters: patches transformers/trl)
from unsloth import FastLanguageModel

from trainer_core.config import TrainConfig
from trainer_core.worker import model_resolver
from trainer_core.worker.engines import transformers_engine, unsloth_vision

NAME = "unsloth"
to_dataset = transformers_engine.to_dataset


def load_model(cfg: TrainConfig, model_ref: str, token: str | None, sharded: bool = False):
    if model_resolver.resolve(model_ref, cfg, token).kind == model_resolver.VISION:
        return unsloth_vision.load_model(cfg, model_ref, token)  # raises UnslothCannotLoad to fall back
    checkpointing = "unsloth" if cfg.gradient_checkpointing else False  # Unsloth's offloading variant
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=model_ref, max_seq_length=cfg.max_seq_length, load_in_4bit=cfg.effective_4bit,
        dtype=None, token=token, trust_remote_code=cfg.trust_remote_code,
        full_finetuning=not cfg.effective_use_lora,
        # full fine-tuning has no get_peft_model call below: checkpointing is set here or Unsloth's default wins
        use_gradient_checkpointing=checkpointing,
        # train the model that was asked for: Unsloth otherwise swaps some names for its own -bnb-4bit
        # repos (another download, which fails offline)
        use_exact_model_name=True,
        # full fine-tuning: fp32 master weights with bf16 autocast (Unsloth's default for a bf16 model is pure
        # bf16, where small updates round away); LoRA leaves Unsloth's own choice (None)
        float32_mixed_precision=True if not cfg.effective_use_lora else None)
    if cfg.effective_use_lora:
        loftq = {"loftq_bits": 4, "loftq_iter": 1} if cfg.use_loftq else None
        # the method's modules trained in full (continued pretraining's embeddings): Unsloth trains target
        # modules it does not adapt in full (its modules_to_save)
        modules = cfg.effective_target_modules + list(cfg.method_spec.saved_modules(cfg))
        model = FastLanguageModel.get_peft_model(
            model, r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
            target_modules=modules, bias="none",
            use_gradient_checkpointing=checkpointing,
            random_state=cfg.random_seed, use_rslora=cfg.use_rslora,
            init_lora_weights="loftq" if cfg.use_loftq else True, loftq_config=loftq)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def build_trainer(cfg, model, tokenizer, train_ds, eval_ds, output_dir, run_dir, callbacks, sharded: bool = False):
    if cfg.method == "sft" and "images" in train_ds.column_names:  # image rows: Unsloth's vision collator
        args = transformers_engine.training_args(cfg, output_dir, run_dir, eval_ds is not None)
        return unsloth_vision.build_trainer(cfg, model, tokenizer, train_ds, eval_ds, args, callbacks)
    # The model already carries its LoRA adapters (get_peft_model above): don't wrap it twice. Embeddings for
    # continued pretraining are in target_modules, which Unsloth trains in full (its modules_to_save), and
    # the method's optimizer gives them embedding_learning_rate.
    return transformers_engine.build_trainer(cfg, model, tokenizer, train_ds, eval_ds, output_dir, run_dir,
                                             callbacks, apply_peft=False)
