"""The same training job as a studio run, as a bare TRL script: no orchestrator, event log, database,
heartbeat thread or control polling. The baseline (a) of ``bench/overhead.py``: TRL's trainers (SFTTrainer on the
processor for image rows), and for speech and embeddings the method's own (transformers' Seq2SeqTrainer for stt, the
FramesTrainer for tts, sentence-transformers' SentenceTransformerTrainer for embedding).

Usage: ``python bench/bare_trl.py CONFIG_YAML OUT_DIR`` (PYTHONPATH at the repository root). Writes
``OUT_DIR/result.json``: the wall time at each logged step, the losses and the torch thread count.

It loads the model and builds the trainer with the engine's own functions (``load_model``, ``to_dataset``,
``build_trainer``) rather than a hand-written SFTConfig: the arguments are then identical to the worker's
by construction, so the benchmark measures what the studio adds around ``trainer.train()`` and not a
drifted copy of the config. The only callback is a timer that stamps each log, at the same point of the
step where the worker stamps its progress event.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path

from trainer_core.planning import modality, model_info
from trainer_core.config import TrainConfig
from trainer_core.data.loading import load_local
from trainer_core.worker.engines import choose_engine


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python bench/bare_trl.py CONFIG_YAML OUT_DIR", file=sys.stderr)
        return 2
    cfg = TrainConfig.from_yaml(Path(argv[1]).read_text())
    out = Path(argv[2])
    if cfg.hf_dataset or cfg.local_eval_datasets or cfg.eval_fraction > 0:
        print("bare_trl: local training data without an eval set only (the benchmark times the train loop)",
              file=sys.stderr)
        return 2
    # The engine first, as in the worker: unsloth must be imported before transformers when it is used.
    engine_name = choose_engine(vision=is_vision_model(cfg))
    engine = importlib.import_module(f"trainer_core.worker.engines.{engine_name}_engine")
    import torch
    from transformers import TrainerCallback

    from trainer_core.worker import methods as worker_methods, model_files, vision

    class LogTimer(TrainerCallback):
        """Wall time of every training log, like the worker's ProgressEvent.ts."""

        def __init__(self):
            self.steps: list[int] = []
            self.times: list[float] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.times.append(time.time())
                self.steps.append(state.global_step)

    model_ref = model_files.resolve_model(cfg)
    if cfg.method_spec.loads_own_model:  # stt, tts, embedding: the method's worker half loads it, as in the worker
        model, tokenizer = worker_methods.get(cfg.method).load_model(cfg, model_ref, None)
    else:
        model, tokenizer = engine.load_model(cfg, model_ref, None)
    rows = load_local(cfg.local_datasets, cfg).rows
    if not cfg.method_spec.loads_own_model:  # as the worker: image rows train with the processor (text: unchanged)
        tokenizer, rows, _ = vision.prepare_run(tokenizer, rows, [], cfg, print, print)
    train_ds = engine.to_dataset(rows, cfg)
    timer = LogTimer()
    trainer = engine.build_trainer(cfg, model, tokenizer, train_ds, None, out / "checkpoints", out, [timer])
    trainer.train()
    trainer.save_model(str(out / "adapter"))  # the worker saves too; outside the timed loop on both sides
    tokenizer.save_pretrained(str(out / "adapter"))

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    result = {"engine": engine_name, "torch_threads": torch.get_num_threads(), "steps": timer.steps,
              "times": timer.times, "losses": losses, "final_loss": losses[-1] if losses else None}
    (out / "result.json").write_text(json.dumps(result))
    return 0


def is_vision_model(cfg: TrainConfig) -> bool:
    """The worker's engine choice input (trainer_core.worker.train): a vision-language model from its config files;
    one whose config cannot be read (the bundled embedding model's name) is text."""
    try:
        return modality.detect_modality(cfg.model_name, os.environ.get("HF_TOKEN") or None).kind == modality.VISION
    except (model_info.ModelInfoError, OSError):
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv))
