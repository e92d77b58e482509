"""The New run page's vision panels through AppTest: the detector's line for a vision model folder (config files
only, no weights) and thumbnails of the chosen file's first image rows with their image tokens."""
from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path

from PIL import Image, ImageFile
from streamlit.runtime.media_file_manager import MediaFileManager
from streamlit.testing.v1 import AppTest

from tests.support.apptest import NEW_RUN, open_page
from tests.support.vision import IMAGE_TOKENS, shape_rows
from tests.support.data_rows import write_jsonl



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


def test_vision_model_line_and_image_thumbnails(app_home, tmp_path):
    model = _vision_model(tmp_path / "tiny-llava")
    data = write_jsonl(tmp_path / "shapes" / "train.jsonl", shape_rows(tmp_path / "shapes", 5, seed=4))
    at = open_page(NEW_RUN, timeout=60)
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
    at = open_page(NEW_RUN, timeout=60)
    at.radio(key="nr_dataset_source").set_value("local")
    at.text_input(key="nr_local_datasets").input(str(data)).run()
    assert not at.exception, at.exception
    assert not any("Vision-language model" in i.value for i in at.info)
    assert any(w.value.startswith("**local_datasets**: row 0: image") and "is a URL" in w.value for w in at.warning)


def _with_dataset(data: Path) -> AppTest:
    at = open_page(NEW_RUN, timeout=60)
    at.radio(key="nr_dataset_source").set_value("local")
    at.text_input(key="nr_local_datasets").input(str(data)).run()
    assert not at.exception, at.exception
    return at


def _served_images(monkeypatch) -> list:
    """What the page hands Streamlit's media manager (which /media/<hash> serves): bytes, or a path it reads."""
    served, add = [], MediaFileManager.add

    def spy(self, path_or_data, mimetype, *args, **kwargs):
        if mimetype.startswith("image/"):
            served.append(path_or_data)
        return add(self, path_or_data, mimetype, *args, **kwargs)

    monkeypatch.setattr(MediaFileManager, "add", spy)
    return served


def _png_header_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` grey pixels (a 13000 x 13000 one compresses to 657 KB; the
    header is what a decoder believes before it allocates)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" * (width + 1))) + chunk(b"IEND", b""))


def test_a_row_naming_a_file_that_is_not_an_image_is_that_rows_problem(app_home, tmp_path):
    """Before, st.image raised on the text file and New run showed a traceback instead of the page."""
    rows = shape_rows(tmp_path / "shapes", 3, seed=4)
    (tmp_path / "shapes" / "notes.png").write_text("not a picture")
    rows.insert(1, {"image": "notes.png", "question": "What colour is the shape?", "answer": "red"})
    at = _with_dataset(write_jsonl(tmp_path / "shapes" / "train.jsonl", rows))
    assert len(at.get("image")) == 3  # the three images that decode; the broken row gets none
    assert ("**local_datasets**: row 1: image 'notes.png' is not an image that can be read: replace it with a "
            "PNG, JPEG, WebP or GIF file, or remove the row") in [w.value for w in at.warning]


def test_a_huge_image_is_refused_from_its_header_and_never_decoded(app_home, tmp_path, monkeypatch):
    """A 13000 x 13000 PNG uploaded as .csv: before, the thumbnail decoded it in the dashboard (1.6 GB, 49 s at
    every rerun). The header's size is checked against the Playground's pixel limit before any decoding."""
    decoded = []
    load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: decoded.append(self.size) or load(self))
    rows = shape_rows(tmp_path / "shapes", 1, seed=4)
    (tmp_path / "shapes" / "rows.csv").write_bytes(_png_header_claiming(13000, 13000))  # named by content, not suffix
    rows.append({"image": "rows.csv", "question": "What colour is the shape?", "answer": "grey"})
    (tmp_path / "shapes" / "vast.png").write_bytes(_png_header_claiming(20000, 20000))  # past Pillow's own guard
    rows.append({"image": "vast.png", "question": "What colour is the shape?", "answer": "grey"})
    at = _with_dataset(write_jsonl(tmp_path / "shapes" / "train.jsonl", rows))
    assert (13000, 13000) not in decoded and (20000, 20000) not in decoded
    assert len(at.get("image")) == 1
    assert ("**local_datasets**: row 2: image 'vast.png' claims far more pixels than the 16,777,216 the dashboard "
            "decodes: resize it, or remove the row") in [w.value for w in at.warning]
    assert ("**local_datasets**: row 1: image 'rows.csv' is 13,000 x 13,000 pixels, more than the 16,777,216 the "
            "dashboard decodes (the serve gate's limit too): resize it, or remove the row") in [w.value for w in at.warning]


def test_thumbnails_are_small_decoded_images_built_once(app_home, tmp_path, monkeypatch):
    """The browser gets a thumbnail of what decoded (never the file as it is, never a path), built once per file:
    a rerun of the page does not open the images again."""
    served = _served_images(monkeypatch)
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(2):
        Image.new("RGB", (1200, 800), (200, 40 * i, 40)).save(folder / f"p{i}.jpg", quality=90)
    rows = [{"image": f"p{i}.jpg", "question": "What colour is it?", "answer": "red"} for i in range(2)]
    opened = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda fp, *a, **k: (isinstance(fp, (str, Path)) and opened.append(fp))
                        or real_open(fp, *a, **k))  # the image files (Streamlit opens the PNG bytes it is given)
    at = _with_dataset(write_jsonl(folder / "train.jsonl", rows))
    assert len(at.get("image")) == 2
    assert served and all(isinstance(data, bytes) for data in served)
    for data in served:
        with Image.open(io.BytesIO(data)) as thumb:
            assert max(thumb.size) <= 192, thumb.size
    before = len(opened)
    at.run()
    assert not at.exception and len(at.get("image")) == 2
    assert before and len(opened) == before  # cached: the images are not opened (nor decoded) again
