"""transformers + peft (+ the method's trainer: TRL's SFTTrainer for sft and cpt): the engine that runs
everywhere. Worker-only."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from peft import LoftQConfig, LoraConfig, PeftModel
from transformers import TrainerCallback

from trainer_core.config import TrainConfig
from trainer_core.worker import methods as worker_methods
from trainer_core.worker import model_resolver, token_cache

NAME = "transformers"


def load_model(cfg: TrainConfig, model_ref: str, token: str | None, sharded: bool = False):
    """``sharded``: FSDP places the weights itself (the model is loaded on the CPU first)."""
    kwargs: dict[str, Any] = {"token": token, "trust_remote_code": cfg.trust_remote_code}
    resolved = model_resolver.resolve(model_ref, cfg, token)  # config -> auto class (text or vision-language)
    if resolved.kind == model_resolver.VISION:
        tokenizer = model_resolver.load_processor(model_ref, cfg, token)  # the worker picks processor or tokenizer
    else:
        tokenizer = token_cache.load_tokenizer(cfg, model_ref, token)  # the preview loads it the same way
    if cfg.effective_4bit:
        from transformers import BitsAndBytesConfig  # only reachable on CUDA hosts with the gpu extra

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute_dtype())
    kwargs["dtype"] = load_dtype(cfg)
    if torch.cuda.is_available() and not sharded:
        # One GPU per process: CUDA_VISIBLE_DEVICES holds the run's GPUs and torchrun's LOCAL_RANK picks this
        # process's one (0 for a single process). Without it the Trainer would wrap the model in
        # nn.DataParallel over every visible GPU.
        kwargs["device_map"] = {"": int(os.environ.get("LOCAL_RANK", "0"))}
    if cfg.method_spec.model_class == "sequence_classification":  # a reward model: one score per sequence
        kwargs["num_labels"] = 1
    model = resolved.model_class.from_pretrained(model_ref, **kwargs)
    if cfg.effective_4bit:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.gradient_checkpointing)
    if cfg.init_adapter:  # a run continuing an adapter trains its saved weights (peft_config adds no new one)
        model = PeftModel.from_pretrained(model, cfg.init_adapter, is_trainable=True)
    return model, tokenizer


def compute_dtype() -> torch.dtype:
    """The dtype matmuls run in: bf16 where the GPU has it, fp16 on older GPUs, fp32 on a CPU."""
    if torch.cuda.is_available():
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32  # CPU: fp32 is the fast and exact path


def load_dtype(cfg: TrainConfig) -> torch.dtype:
    """Full fine-tuning keeps fp32 master weights (autocast computes in bf16/fp16): in pure bf16 an update
    smaller than 1/256 of a weight rounds away, and at 2e-5 most do. Frozen bases under LoRA load in the
    compute dtype; their adapters are fp32 anyway (PEFT)."""
    if not cfg.effective_use_lora:
        return torch.float32
    return compute_dtype()


def peft_config(cfg: TrainConfig, model=None) -> LoraConfig | None:
    if not cfg.effective_use_lora or cfg.init_adapter:  # init_adapter: load_model loaded the adapter to train
        return None
    saved = list(cfg.method_spec.saved_modules(cfg)) or None  # the method's modules trained in full
    targets: Any = cfg.effective_target_modules
    if model is not None and model_resolver.is_vision_config(model.config):
        # by full name: the vision tower has q_proj/k_proj too, adapted only when finetune_vision_layers says so
        targets = model_resolver.lora_targets(model, cfg)
        if not targets:
            raise ValueError("target_modules: no layer of this vision-language model matches the LoRA switches: turn "
                             "on finetune_language_layers or finetune_vision_layers, and attention or MLP modules")
    return LoraConfig(
        r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
        target_modules=targets, use_rslora=cfg.use_rslora, bias="none",
        task_type="CAUSAL_LM", modules_to_save=saved,
        init_lora_weights="loftq" if cfg.use_loftq else True,
        loftq_config=LoftQConfig(loftq_bits=4) if cfg.use_loftq else {})


def to_dataset(rows: list[dict], cfg: TrainConfig) -> Dataset:
    """Rows in the shape the run's method trains on (e.g. SFT's prompt/completion split for
    completions-only loss), as a dataset."""
    shaped, _ = worker_methods.get(cfg.method).shape_rows(rows, cfg)
    return Dataset.from_list(shaped)


def training_args(cfg: TrainConfig, output_dir: Path, run_dir: Path, has_eval: bool,
                  sharded: bool = False) -> dict[str, Any]:
    """The TrainingArguments settings every method shares; the method adds its own and picks the class."""
    report_to = []
    if cfg.enable_wandb:
        report_to.append("wandb")
        os.environ.setdefault("WANDB_PROJECT", cfg.wandb_project)
        os.environ.setdefault("WANDB_DIR", str(run_dir))
    if cfg.enable_tensorboard:
        report_to.append("tensorboard")
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(run_dir / cfg.tensorboard_dir)
    on_cuda = torch.cuda.is_available()
    half = compute_dtype() if on_cuda else None
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return dict(
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
        eval_strategy="steps" if has_eval else "no",
        eval_steps=cfg.eval_steps,
        report_to=report_to,
        gradient_checkpointing=cfg.gradient_checkpointing,
        bf16=half == torch.bfloat16,
        fp16=half == torch.float16,
        use_cpu=not on_cuda,
        dataloader_num_workers=0,
        disable_tqdm=True,  # progress goes through our events; tqdm bars only bloat worker.log
        **(data_parallel_args(on_cuda, sharded) if world_size > 1 else {}),
    )


def build_trainer(cfg: TrainConfig, model, tokenizer, train_ds: Dataset, eval_ds: Dataset | None,
                  output_dir: Path, run_dir: Path, callbacks: list[TrainerCallback], apply_peft: bool = True,
                  sharded: bool = False):
    """The run's method builds its trainer from the loaded model, the data and the shared arguments."""
    args = training_args(cfg, output_dir, run_dir, eval_ds is not None, sharded)
    return worker_methods.get(cfg.method).build_trainer(
        cfg, model, tokenizer, train_ds, eval_ds, args, callbacks, peft_config(cfg, model) if apply_peft else None)


def data_parallel_args(on_cuda: bool, sharded: bool) -> dict[str, Any]:
    """TrainingArguments settings for a run under torchrun (RANK/WORLD_SIZE set): the Trainer then trains with DDP,
    or FSDP when ``sharded``."""
    return {
        # DDP cannot re-enter autograd per bucket: checkpointing must be the non-reentrant kind.
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
        "ddp_backend": "nccl" if on_cuda else "gloo",
        "ddp_find_unused_parameters": False,  # every trainable weight gets a gradient each step
        "fsdp": "full_shard auto_wrap" if sharded else "",  # layers to wrap: the model's _no_split_modules
    }
