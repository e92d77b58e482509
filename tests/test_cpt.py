"""Continued pretraining on raw text, for real: orchestrator -> worker -> engine on the tiny model."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from tests.support import run_python
from trainer_core.config import TrainConfig
from trainer_core.protocol.status import RunStatus

pytestmark = pytest.mark.train


# Reads the optimizer the run saved: lr and size of each param group (constant schedule, no warmup, so the
# saved lr is the configured one), and which parameters the adapter holds.
READ_CHECKPOINT = """
import json, sys, torch
from safetensors import safe_open
state = torch.load(sys.argv[1] + "/optimizer.pt", weights_only=False)
groups = [{"lr": g["lr"], "size": len(g["params"])} for g in state["param_groups"]]
with safe_open(sys.argv[2] + "/adapter_model.safetensors", "pt") as f:
    keys = sorted(f.keys())
print(json.dumps({"groups": groups, "keys": keys}))
"""


def raw_text_file(folder: Path) -> Path:
    """Repetitive documents of mixed lengths (some longer than max_seq_length, so packing must split them)."""
    sentences = ["The river runs to the sea.", "Bread is baked in the morning.", "Cats sleep in the sun."]
    path = folder / "corpus.jsonl"
    with path.open("w") as out:
        for i in range(24):
            text = " ".join(sentences[(i + k) % 3] for k in range(2 + (i % 5) * 4))
            out.write(json.dumps({"text": text}) + "\n")
    return path


def test_continued_pretraining_with_packing_and_embedding_lr(studio, tiny_model, tmp_path):
    corpus = raw_text_file(tmp_path)
    cfg = TrainConfig(run_name="cpt", model_name=str(tiny_model), method="cpt", format_type="text",
                      local_datasets=[str(corpus)], packing=True, max_seq_length=64, batch_size=2, max_steps=12,
                      learning_rate=5e-3, embedding_learning_rate=1e-3, lr_scheduler_type="constant",
                      warmup_steps=0, save_steps=12, logging_steps=1)
    assert cfg.validate() == []
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=600)
    log = studio.log_tail(run_id, 200)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{log}"

    loss = list(studio.metrics(run_id).dropna(subset=["loss"])["loss"])
    assert len(loss) == 12 and all(math.isfinite(v) for v in loss)
    assert sum(loss[-3:]) / 3 < sum(loss[:3]) / 3 - 0.3, loss  # it learns the repeated sentences

    run_dir = Path(studio.get_run(run_id).output_dir).parent
    saved = run_python(READ_CHECKPOINT, str(run_dir / "checkpoints" / "checkpoint-12"), str(run_dir / "adapter"))
    assert saved.returncode == 0, saved.stderr[-2000:]
    found = json.loads(saved.stdout.strip().splitlines()[-1])
    # group 0: the LoRA matrices at learning_rate; group 1: the saved embedding and lm_head copies
    assert [g["lr"] for g in found["groups"]] == [5e-3, 1e-3]
    assert found["groups"][0]["size"] == 2 * 7 * 2  # A and B for 7 modules in each of 2 layers
    assert found["groups"][1]["size"] >= 1
    assert any("embed_tokens" in key for key in found["keys"])  # the trained embeddings ship with the adapter
    assert "Tokenized data: " in log  # the engine tokenized through the cache
    assert "torch" not in sys.modules
