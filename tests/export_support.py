"""A finished training run to export, made in seconds: its folder (config.yaml, events.jsonl) and a LoRA adapter
built with PEFT on a real base model in a subprocess (the test process never imports the ML stack)."""
from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support import run_python
from trainer_core.config import TrainConfig
from trainer_core.protocol import events as ev, paths
from trainer_core.protocol.status import JobKind, RunStatus, write_kind

# Random LoRA weights, scaled so that the adapter changes the answers without wrecking the model.
BUILD_ADAPTER = textwrap.dedent("""
    import sys, dataclasses, torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trainer_core.config import TrainConfig
    from trainer_core.worker.model_files import resolve_model

    target, model_name, scale = sys.argv[1], sys.argv[2], float(sys.argv[3])
    base = resolve_model(dataclasses.replace(TrainConfig(), model_name=model_name))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                             init_lora_weights=False))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.mul_(scale)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(base).save_pretrained(target)
    print("ok")
""")


def make_run(run_id: str, model_name: str, training_type: str = "lora", scale: float = 0.2,
             losses: tuple[float, ...] = (2.5, 2.1, 1.8, 1.6)) -> Path:
    """runs/<run_id>/ as a completed LoRA (or QLoRA) run leaves it: config, event log, adapter."""
    run_dir = paths.run_dir(run_id)
    run_dir.mkdir(parents=True)
    cfg = TrainConfig(run_name=f"export test {run_id[-6:]}", model_name=model_name, training_type=training_type,
                      max_steps=len(losses))
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    write_kind(run_dir, JobKind.TRAIN)
    writer = ev.EventWriter(run_dir / ev.LOG_NAME)
    for step, loss in enumerate(losses, 1):
        writer.emit(ev.ProgressEvent(step=step, total_steps=len(losses), loss=loss))
    writer.emit(ev.EvalEvent(step=len(losses), eval_loss=1.9))
    writer.emit(ev.CompleteEvent(status=RunStatus.COMPLETED.value, output_dir=str(run_dir / "adapter"),
                                 steps=len(losses), final_loss=losses[-1]))
    writer.close()
    done = run_python(BUILD_ADAPTER, str(run_dir / "adapter"), model_name, str(scale))
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir
