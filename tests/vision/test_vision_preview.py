"""The data preview of image rows (the real preview child on the tiny LLaVA): lengths count every image's tokens,
image tokens are never trained, and a row shows where its image goes and how many tokens it takes."""
from __future__ import annotations

import dataclasses

import pytest

from tests.support.vision import IMAGE_TOKENS, build_tiny_vlm, shape_rows
from tests.support.data_rows import write_jsonl
from trainer_core.data import preview
from trainer_core.config import TrainConfig

pytestmark = pytest.mark.subprocess


def test_preview_counts_image_tokens_and_marks_where_they_go(studio, tmp_path):
    model = build_tiny_vlm()
    data = write_jsonl(tmp_path / "s" / "train.jsonl", shape_rows(tmp_path / "s", 4, seed=5))
    cfg = TrainConfig(model_name=str(model), local_datasets=[str(data)], max_seq_length=64, train_on_completions=True)
    p = preview.build_preview(cfg)
    text_only = preview.build_preview(dataclasses.replace(cfg, max_seq_length=33))  # one token short
    assert p.format == "vision" and len(p.lengths) == 4
    # '<|im_start|>user\n' (3) + 16 image tokens + question, answer and markers: the same length for every row
    assert set(p.lengths) == {34} and p.truncated == 0
    assert p.total_tokens == 4 * 34
    assert 4 * 2 <= p.trained_tokens <= 4 * 4  # completions only: the colour word(s) and <|im_end|>\n per row
    row = p.rows[0]
    assert row.label == "1 image(s)" and row.num_tokens == 34
    assert row.segments[0][0].startswith(f"<|im_start|>user\n<image> × {IMAGE_TOKENS} tokensWhat colour")
    assert row.segments[0][1] is False and row.segments[-1][1] is True
    assert text_only.truncated == 4  # the preview says what the worker's fit check will drop
