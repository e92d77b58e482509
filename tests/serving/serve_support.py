"""A trained run faked on disk for serving tests: config.yaml plus a LoRA adapter made with peft on the
bundled model (its B matrices set to non-zero, so it changes the answers), built in a subprocess."""
from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support import bundled_model_folder, run_python
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, write_kind

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
        import shutil

        shutil.copytree(run_dir / "adapter", run_dir / "checkpoints" / f"checkpoint-{step}")
        (run_dir / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    return run_dir
