"""The New run page's vision panels through AppTest: the detector's line for a vision model folder (config files
only, no weights) and thumbnails of the chosen file's first image rows with their image tokens."""
from __future__ import annotations

import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

from tests.support import ROOT
from tests.vision_support import IMAGE_TOKENS, shape_rows, write_jsonl

APP = str(ROOT / "streamlit_app.py")


def _vision_model(folder: Path) -> Path:
    """A tiny LLaVA's config files (the detector never reads weights)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "image_token_index": 49152,
        "vision_feature_select_strategy": "full", "image_seq_length": IMAGE_TOKENS,
        "vision_config": {"model_type": "siglip_vision_model", "image_size": 32, "patch_size": 8},
        "text_config": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                        "vocab_size": 49153}}))
    return folder


def _page(**session) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("pages/new_run.py").run()
    assert not at.exception, at.exception
    return at


def test_vision_model_line_and_image_thumbnails(app_home, tmp_path):
    model = _vision_model(tmp_path / "tiny-llava")
    data = write_jsonl(tmp_path / "shapes" / "train.jsonl", shape_rows(tmp_path / "shapes", 5, seed=4))
    at = _page()
    at.radio(key="nr_model_source").set_value("local")
    at.text_input(key="nr_model_text").input(str(model)).run()
    at.radio(key="nr_dataset_source").set_value("local")
    at.text_input(key="nr_local_datasets").input(str(data)).run()
    assert not at.exception, at.exception
    found = [i.value for i in at.info if "Vision-language model" in i.value]
    assert found == ["Vision-language model (LlavaForConditionalGeneration), vision tower siglip_vision_model, "
                     "images at 32×32 px in 8-px patches, 16 tokens per image. Image rows train with its processor; "
                     "text-only data trains as text."]
    assert "Auto-detected format: **vision** (found images: 'image', 'question' and 'answer' columns)." in \
        [c.value for c in at.caption]  # no column pickers for image rows, and no "could not tell the format"
    assert not any("could not tell the format" in w.value for w in at.warning)
    assert len(at.get("image")) == 4  # the first four image rows as thumbnails
    captions = [c.value for c in at.caption if "image tokens" in c.value]
    assert len(captions) == 4 and captions[0].startswith(f"1 image(s) · {IMAGE_TOKENS} image tokens · What colour")


def test_text_model_gets_no_vision_line_and_a_url_is_named(app_home, tmp_path):
    data = write_jsonl(tmp_path / "urls.jsonl", [{"image": "https://example.com/a.png", "question": "q", "answer": "a"}])
    at = _page()
    at.radio(key="nr_dataset_source").set_value("local")
    at.text_input(key="nr_local_datasets").input(str(data)).run()
    assert not at.exception, at.exception
    assert not any("Vision-language model" in i.value for i in at.info)
    assert any(w.value.startswith("**local_datasets**: row 0: image") and "is a URL" in w.value for w in at.warning)
