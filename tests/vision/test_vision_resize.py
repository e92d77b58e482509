"""The image resize setting (issue 20: "Image resizing (max side, as Unsloth's resize) is a setting shown with its
effect on tokens per image"): image_max_side is checked, New run shows what it does to the chosen model's tokens per
image (a count for models whose tokens follow the pixels, the fixed count for fixed-size towers), and the worker
scales images down before the processor sees them, in training, the fit check and the preview alike."""
from __future__ import annotations

import pytest

from tests.support import run_in_child
from tests.support.apptest import NEW_RUN, open_page
from tests.vision.test_vision_form import _vision_model
from tests.support.vision import IMAGE_TOKENS, shape_rows
from tests.support.data_rows import write_jsonl
from trainer_core.config import TrainConfig
from trainer_core.planning.modality import from_configs
from trainer_core.protocol.errors import FieldError
from ui.text import safe

QWEN = from_configs({"architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
                     "vision_config": {"model_type": "qwen2_vl", "patch_size": 14, "spatial_merge_size": 2}})


@pytest.mark.parametrize("side, ok", [(0, True), (28, True), (512, True), (27, False), (-1, False), (9000, False)])
def test_image_max_side_is_zero_or_a_size_a_tower_can_see(home, side, ok):
    problems = [e for e in TrainConfig(image_max_side=side).validate() if e.field == "image_max_side"]
    assert (problems == []) is ok, problems
    if side == 27:
        assert problems == [FieldError("image_max_side", "0 (images as they are) or at least 28 px: a smaller image "
                                                         "holds no patch of a vision tower")]


def test_the_effect_on_tokens_per_image_is_said_for_the_model_at_hand():
    assert QWEN.resize_effect(448) == ("At image_max_side 448 px: at most 256 tokens per image (a square one; one "
                                       "token per 28×28 px block).")  # (448 / 28)² : Qwen2-VL merges 2×2 14-px patches
    assert QWEN.resize_effect(0).startswith("Images go in at their own size: one token per 28×28 px block (a 1024×1024 "
                                            "image is 1,369 tokens)")
    llava = from_configs({"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
                          "image_token_index": 1, "image_seq_length": 576,
                          "vision_config": {"model_type": "clip_vision_model", "image_size": 336, "patch_size": 14}})
    assert llava.resize_effect(512) == ("The processor resizes every image to 336×336 px: 576 tokens per image "
                                        "whatever image_max_side (it only saves decoding large files).")
    assert from_configs({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).resize_effect(512) == ""


def test_new_run_shows_the_setting_and_its_effect_for_a_vision_model(app_home, tmp_path):
    model = _vision_model(tmp_path / "tiny-llava")
    at = open_page(NEW_RUN, timeout=60)
    at.radio(key="nr_model_source").set_value("local")
    at.text_input(key="nr_model_text").input(str(model)).run()
    at.number_input(key="nr_image_max_side").set_value(256).run()
    assert not at.exception, at.exception
    assert [c.value for c in at.caption if "whatever image" in c.value] == [safe(
        f"The processor resizes every image to 32×32 px: {IMAGE_TOKENS} tokens per image whatever image_max_side (it "
        "only saves decoding large files).")]


@pytest.mark.subprocess
def test_the_worker_scales_images_down_before_the_processor(tmp_path):
    rows = shape_rows(tmp_path / "shapes", 2, seed=3)
    write_jsonl(tmp_path / "shapes" / "train.jsonl", rows)
    print(run_in_child(scaled_checks, str(tmp_path / "shapes")))


def scaled_checks(folder: str) -> None:
    from pathlib import Path

    from PIL import Image

    from trainer_core.worker import vision

    big = Path(folder) / "big.png"
    Image.new("RGB", (1200, 300), "red").save(big)
    row = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]},
                        {"role": "assistant", "content": [{"type": "text", "text": "red"}]}], "images": [str(big)]}
    assert vision.prepared(row, 0)["images"][0].size == (1200, 300)  # 0: as it is
    assert vision.prepared(row, 400)["images"][0].size == (400, 100)  # the longest side to 400, the shape kept
    assert vision.prepared(row, 2000)["images"][0].size == (1200, 300)  # never scaled up
    from trainer_core.evaluation.samples import Sample  # an eval's rows are scaled as the run's training rows
    from trainer_core.worker.vision_eval import pictures

    assert [p.size for p in pictures(Sample(0, [], "red", images=(str(big),)), 400)] == [(400, 100)]
    assert [p.size for p in pictures(Sample(0, [], "red", images=(str(big),)))] == [(1200, 300)]
    bomb = Path(folder) / "bomb.png"  # a small file whose pixels would take gigabytes in RGB (hostile review)
    Image.new("1", (9000, 8000)).save(bomb)
    try:
        vision.load_image(str(bomb))
        raise AssertionError("a 72-megapixel image was decoded")
    except ValueError as exc:
        assert str(exc) == "the image is 9000×8000 px, more than 64,000,000 pixels: resize it", exc
    print("ok")
