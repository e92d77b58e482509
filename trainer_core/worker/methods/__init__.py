"""Worker halves of the training methods, looked up by the name the dashboard registry uses
(``trainer_core.methods.METHODS``). Worker-only: each half imports trl/transformers.

A half has ``shape_rows(rows, cfg) -> (rows, dropped)`` (rows as its trainer takes them, the preview uses it
too) and ``build_trainer(cfg, model, tokenizer, train_ds, eval_ds, args, callbacks, peft_config)`` returning
a ``transformers.Trainer`` (TRL's, sentence-transformers', Seq2Seq). ``args`` are the engine's
TrainingArguments settings every method shares; the progress callback, Stop/Cancel and checkpoints stay
generic because every such trainer is a ``transformers.Trainer``.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from trainer_core.methods import METHODS

# name -> module of its worker half; one line per method, beside its line in trainer_core.methods
WORKER_HALVES = {name: f"trainer_core.worker.methods.{name}"
                 for name in ("sft", "cpt", "dpo", "orpo", "simpo", "kto", "reward", "grpo", "embedding", "stt", "tts")}


def get(name: str) -> ModuleType:
    """The worker half of a registered method, imported on first use (only the run's method loads)."""
    if name not in METHODS or name not in WORKER_HALVES:
        raise KeyError(f"unknown method {name!r}; registered: {', '.join(WORKER_HALVES)}")
    return importlib.import_module(WORKER_HALVES[name])
