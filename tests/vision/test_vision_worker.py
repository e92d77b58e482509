"""The worker's vision glue on the tiny LLaVA, in one subprocess (this process plays the dashboard): the resolver's
auto classes, the LoRA switches' layers, the collator's labels, the fit check and a vision model on text data."""
from __future__ import annotations

import json
import textwrap

import pytest

from tests.support import bundled_model_folder, run_python
from tests.support.vision import IMAGE_TOKENS, build_tiny_vlm, shape_rows

pytestmark = pytest.mark.subprocess

GLUE = textwrap.dedent("""
    import json, sys
    from transformers import PreTrainedTokenizerBase
    from trainer_core.config import TrainConfig
    from trainer_core.data.images import normalize
    from trainer_core.worker import model_resolver, vision

    vlm, text_model, rows = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    out = {}
    cfg = TrainConfig(model_name=vlm, target_modules=[])
    resolved = model_resolver.resolve(vlm, cfg, None)
    out["vlm"] = [resolved.kind, resolved.model_class.__name__]
    resolved = model_resolver.resolve(text_model, cfg, None)
    out["text"] = [resolved.kind, resolved.model_class.__name__]
    reward = model_resolver.resolve(text_model, TrainConfig(method="reward"), None)
    out["reward"] = reward.model_class.__name__

    model = model_resolver.AutoModelForImageTextToText.from_pretrained(vlm)
    processor = model_resolver.load_processor(vlm, cfg, None)
    def sides(**switches):
        names = model_resolver.lora_targets(model, TrainConfig(target_modules=[], **switches))
        return sorted({model_resolver.part_of(n) + ":" + n.rsplit(".", 1)[-1] for n in names})
    out["default"] = sides()
    out["vision_attention"] = sides(finetune_vision_layers=True, finetune_language_layers=False,
                                    finetune_mlp_modules=False)

    data = normalize(rows, None, "", "local_datasets")
    collate = vision.collator(processor, TrainConfig(max_seq_length=64))
    batch = collate([dict(r) for r in data.rows[:2]])
    image = batch["input_ids"] == processor.image_token_id
    out["image_tokens"] = image.sum(dim=1).tolist()
    out["image_labels"] = sorted(set(batch["labels"][image].tolist()))
    out["pixel_values"] = list(batch["pixel_values"].shape)

    warned = []
    lengths = [vision.row_length(processor, r) for r in data.rows]
    short = TrainConfig(max_seq_length=max(lengths) - 1)
    kept = vision.fitting_rows(data.rows, processor, short, warned.append, lambda m: None)
    out["kept"] = [len(kept), len(data.rows)]
    try:
        vision.fitting_rows(data.rows, processor, TrainConfig(max_seq_length=min(lengths) - 1), warned.append,
                            lambda m: None)
    except vision.VisionDataError as exc:
        out["none_fit"] = str(exc)
    chat = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}]
    as_text = vision.processing_for(processor, chat, cfg, warned.append)
    out["as_text"] = isinstance(as_text, PreTrainedTokenizerBase)
    out["warned"] = warned
    print(json.dumps(out))
""")


def test_resolver_lora_switches_collator_and_fit_check(tmp_path):
    vlm = build_tiny_vlm()
    rows = shape_rows(tmp_path, 4, seed=3)
    rows = [{**r, "image": str(tmp_path / r["image"])} for r in rows]
    rows[3]["question"] = "Look closely at this picture and tell me, in one word, what colour the shape is?"
    result = run_python(GLUE, str(vlm), str(bundled_model_folder()), json.dumps(rows))
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["vlm"] == ["vision", "AutoModelForImageTextToText"]
    assert out["text"] == ["text", "AutoModelForCausalLM"]
    assert out["reward"] == "AutoModelForSequenceClassification"
    # default switches: the language model's attention and MLP only, never the tower sharing the q_proj names
    assert out["default"] == [f"language:{m}" for m in sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                              "up_proj", "down_proj"])]
    assert out["vision_attention"] == ["projector:linear_1", "projector:linear_2", "vision:k_proj", "vision:out_proj",
                                       "vision:q_proj", "vision:v_proj"]
    assert out["image_tokens"] == [IMAGE_TOKENS, IMAGE_TOKENS]  # one <image> expanded to 16 tokens per row
    assert out["image_labels"] == [-100]  # never trained on
    assert out["pixel_values"] == [2, 3, 32, 32]
    assert out["kept"] == [3, 4]  # the long question no longer fits with its image: dropped, named
    assert out["warned"][0].startswith("Dropped 1 of 4 image rows longer than max_seq_length")
    assert "(rows 3;" in out["warned"][0]
    assert out["none_fit"].startswith("max_seq_length: every row is longer than")
    assert out["as_text"] is True  # a vision model on text data: its tokenizer, not the processor
    assert "trains as a text model" in out["warned"][-1]
