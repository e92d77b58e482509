"""Finished LoRA runs made in seconds, for export and serving tests: a run folder (config.yaml, the job kind, the
event log) and a LoRA adapter with random weights built with PEFT on a real base model in a subprocess (the test
process never imports the ML stack). ``lora_run`` scales the adapter to change answers without wrecking the
model (export's verify compares them); ``fake_trained_run`` makes it strong enough to change greedy answers
(the serve tests tell the tuned model from the base)."""
from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from tests.support.env import run_python
from tests.support.models import bundled_model_folder
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.protocol import events as ev, paths
from trainer_core.protocol.status import JobKind, RunStatus, write_kind

# Random LoRA weights, scaled so that the adapter changes the answers without wrecking the model.
BUILD_ADAPTER = textwrap.dedent("""
    import sys, dataclasses, torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trainer_core.config import BUNDLED_MODEL, TrainConfig
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
    tokenizer = AutoTokenizer.from_pretrained(base)
    if sys.argv[4:] == ["hermes"]:  # as a run on tool-call data saves it (worker/tool_template.use)
        from trainer_core.worker import tool_template
        tool_template.use(tokenizer, dataclasses.replace(TrainConfig(), tool_template="hermes"))
    tokenizer.save_pretrained(target)
    print("ok")
""")


def lora_run(run_id: str, model_name: str, adapter: str = "lora", scale: float = 0.2,
             losses: tuple[float, ...] = (2.5, 2.1, 1.8, 1.6), tool_template: bool = False) -> Path:
    """runs/<run_id>/ as a completed LoRA (or QLoRA) run leaves it: config, event log, adapter. ``tool_template``: the
    adapter's tokenizer carries the Hermes tool template, as a run trained on tool-call data leaves it."""
    run_dir = paths.run_dir(run_id)
    run_dir.mkdir(parents=True)
    cfg = TrainConfig(run_name=f"export test {run_id[-6:]}", model_name=model_name, adapter=adapter,
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
    done = run_python(BUILD_ADAPTER, str(run_dir / "adapter"), model_name, str(scale),
                      *(["hermes"] if tool_template else []))
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


MAKE_ADAPTER = textwrap.dedent("""
    import sys
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base, target = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(model, config)
    with torch.no_grad():  # strong enough to change greedy answers
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(base).save_pretrained(target)
    print("ok")
""")


def fake_trained_run(run_id: str, name: str, steps: tuple[int, ...] = ()) -> Path:
    """runs/<run_id> with config.yaml, adapter/ and checkpoints/checkpoint-<step>/ (same adapter) for ``steps``."""
    run_dir = paths.run_dir(run_id)
    run_dir.mkdir(parents=True)
    write_kind(run_dir, JobKind.TRAIN)
    cfg = TrainConfig(model_name=BUNDLED_MODEL, run_name=name)
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    result = run_python(MAKE_ADAPTER, str(bundled_model_folder()), str(run_dir / "adapter"))
    assert result.returncode == 0, result.stderr[-3000:]
    for step in steps:
        shutil.copytree(run_dir / "adapter", run_dir / "checkpoints" / f"checkpoint-{step}")
        (run_dir / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    return run_dir
