"""Vision-language SFT for real: the tiny LLaVA (tests/support/vision.py) trained through the orchestrator and a
worker subprocess on coloured shapes drawn with Pillow, then asked the colour of held-out images. The base model
never names a colour; the tuned one must name the right one for most held-out images. Also the worker-side glue
(resolver, LoRA targets, collator, the fit check) in one subprocess: this process plays the dashboard."""
from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import run_python
from tests.support.vision import QUESTION, build_tiny_vlm, shape_rows
from tests.support.data_rows import write_jsonl
from trainer_core.config import TrainConfig
from trainer_core.export.spec import ExportSpec
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus

ANSWER_HELD_OUT = textwrap.dedent("""
    import json, sys
    import torch
    from peft import PeftModel
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    base_dir, adapter_dir, rows = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    processor = AutoProcessor.from_pretrained(adapter_dir)  # the run saved the processor beside its adapter

    def answers(model):
        out = []
        for row in rows:
            messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": row["question"]}]}]
            text = processor.apply_chat_template(messages, add_generation_prompt=True)
            inputs = processor(text=text, images=[Image.open(row["image"]).convert("RGB")], return_tensors="pt")
            with torch.no_grad():
                ids = model.generate(**inputs, max_new_tokens=4, do_sample=False)
            out.append(processor.tokenizer.decode(ids[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
        return out

    model = AutoModelForImageTextToText.from_pretrained(base_dir).eval()
    base = answers(model)
    tuned = answers(PeftModel.from_pretrained(model, adapter_dir).eval())

    # the merged 16-bit folder (export --to merged, serving) loads in transformers with its processor
    from pathlib import Path
    from trainer_core.config import TrainConfig
    from trainer_core.specs.model_source import ModelSource, ResolvedSource
    from trainer_core.worker.sources import merge_adapter

    resolved = ResolvedSource(source=ModelSource(run_id="r"), label="r", base_model=base_dir,
                              adapter_dir=Path(adapter_dir), config=TrainConfig(model_name=base_dir))
    merged_dir = merge_adapter(resolved, Path(sys.argv[4]), dtype="float32")
    processor = AutoProcessor.from_pretrained(merged_dir)
    merged = answers(AutoModelForImageTextToText.from_pretrained(merged_dir).eval())
    print(json.dumps({"base": base, "tuned": tuned, "merged": merged}))
""")


@pytest.fixture(scope="module")
def tiny_vlm():
    return build_tiny_vlm()


def _tensor_names(path: Path) -> list[str]:
    """Tensor names from a safetensors file's JSON header (8-byte length, then JSON): no torch in this process."""
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        return [name for name in json.loads(handle.read(length)) if name != "__metadata__"]


def _score(answers: list[str], rows: list[dict]) -> float:
    return sum(a.strip().lower().startswith(r["answer"]) for a, r in zip(answers, rows)) / len(rows)


@pytest.mark.train
def test_tiny_vlm_learns_the_colours_of_held_out_shapes(studio, tiny_vlm, tmp_path):
    folder = tmp_path / "shapes"
    train = shape_rows(folder, 96, seed=1, prefix="train")
    held_out = shape_rows(folder, 24, seed=2, prefix="held")
    data = write_jsonl(folder / "train.jsonl", train)
    cfg = TrainConfig(run_name="vision e2e", model_name=str(tiny_vlm), local_datasets=[str(data)], max_steps=30,
                      batch_size=8, learning_rate=1e-2, warmup_steps=2, max_seq_length=64, logging_steps=5,
                      train_on_completions=True, finetune_vision_layers=True, lora_r=16, lora_alpha=32,
                      target_modules=[], random_seed=0, sample_prompts=[QUESTION], sample_max_new_tokens=3)
    assert cfg.validate() == []
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=400)
    log = studio.log_tail(run_id, 200)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{log}"
    assert f"Image rows: 96, longest" in log
    # samples during training: text prompts through the processor's tokenizer, answered by the vision model
    assert [s.step for s in studio.samples(run_id)] == [30] and "warning: Samples" not in log

    run = studio.get_run(run_id)
    adapter = Path(run.output_dir)
    assert (adapter / "adapter_model.safetensors").exists() and (adapter / "processor_config.json").exists()
    adapted = _tensor_names(adapter / "adapter_model.safetensors")  # finetune_vision_layers: tower and projector
    assert {"vision_tower", "multi_modal_projector", "language_model"} <= {n.split(".")[3] for n in adapted}, adapted
    assert not any("lm_head" in n or "embed_tokens" in n for n in adapted)

    losses = studio.metrics(run_id).dropna(subset=["loss"])["loss"].tolist()
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.6 * losses[0], losses  # the loss falls

    rows = [{**r, "image": str(folder / r["image"])} for r in held_out]
    result = run_python(ANSWER_HELD_OUT, str(tiny_vlm), str(adapter), json.dumps(rows), str(tmp_path / "merged"))
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    base, tuned = _score(found["base"], rows), _score(found["tuned"], rows)
    print(f"held-out colour accuracy: base {base:.2f}, tuned {tuned:.2f}; losses {losses[0]:.2f} -> {losses[-1]:.3f}")
    assert base <= 0.25  # a random model does not name colours
    assert tuned >= 0.75 and tuned >= base + 0.5, (found, base, tuned)
    assert found["merged"] == found["tuned"]  # merged in float32: the same greedy answers as the adapter

    # export --to merged as a user runs it: the merged folder with its processor, verified by its answers; no GGUF
    gguf = ExportSpec(source=ModelSource(run_id=run_id), targets=["gguf"]).validate()
    assert any(e.field == "targets" and "vision-language" in e.message and "export merged" in e.message for e in gguf)
    job_id = studio.submit(ExportSpec(source=ModelSource(run_id=run_id), targets=["merged"], verify=True,
                                      merged_dtype="float16"))
    snap = studio.wait(job_id, timeout=400)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(job_id, 80)}"
    merged = paths.run_dir(job_id) / "artifacts" / "merged"
    assert (merged / "processor_config.json").exists() and (merged / "model.safetensors").exists()
    verify = json.loads((paths.run_dir(job_id) / "artifacts" / "verify.json").read_text())
    print("vision export verify", verify)
    assert [(v["format"], v["total"]) for v in verify] == [("merged", 4)]  # 4 of the run's own image rows
    assert verify[0]["identical"] >= 3, verify  # float16 weights, answered in float32: at most one may drift
    assert "torch" not in sys.modules and "transformers" not in sys.modules  # the dashboard never imported them
