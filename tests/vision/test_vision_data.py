"""Image + text datasets (trainer_core.data.images) and the config-only model detector (trainer_core.planning.modality):
no ML stack, images drawn with Pillow."""
from __future__ import annotations

import csv
import json

import pytest

from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.data import DatasetError
from trainer_core.data.loading import check_data, load_local
from trainer_core.planning.modality import TEXT, VISION, detect_modality, from_configs
from tests.support.vision import IMAGE_TOKENS, QUESTION, as_messages, shape_rows
from tests.support.data_rows import write_jsonl

USER_IMAGE = [{"type": "image"}, {"type": "text", "text": QUESTION}]


def _cfg(data, **kw) -> TrainConfig:
    return TrainConfig(local_datasets=[str(data)], **{"model_name": MODEL, **kw})


MODEL = ""  # a vision model's config files (no weights): set by the shapes fixture


@pytest.fixture
def shapes(home, tmp_path, monkeypatch):
    folder = tmp_path / "shapes"
    rows = shape_rows(folder, 6, seed=1)
    monkeypatch.setitem(globals(), "MODEL", str(_llava_folder(tmp_path / "vlm", 32, 8, "full")))
    return folder, rows


def test_flat_rows_become_conversations_with_image_placeholders(shapes):
    folder, rows = shapes
    data = load_local([str(write_jsonl(folder / "data.jsonl", rows))], _cfg(folder / "data.jsonl"))
    assert data.format == "vision"
    assert data.reason == "found images: 'image', 'question' and 'answer' columns"
    assert data.rows[0] == {"messages": [{"role": "user", "content": USER_IMAGE},
                                         {"role": "assistant", "content": [{"type": "text", "text": rows[0]["answer"]}]}],
                            "images": [str((folder / rows[0]["image"]).resolve())]}


def test_messages_with_image_parts_and_openai_image_url(shapes):
    folder, rows = shapes
    chat = [as_messages(r) for r in rows[:3]]
    chat.append({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": rows[3]["image"]}},
                                                           {"type": "text", "text": QUESTION}]},
                              {"role": "assistant", "content": "red"}]})
    path = write_jsonl(folder / "chat.jsonl", chat)
    data = load_local([str(path)], _cfg(path))
    assert [r["images"] for r in data.rows] == [[str((folder / r["image"]).resolve())] for r in rows[:4]]
    assert all(r["messages"][0]["content"] == USER_IMAGE for r in data.rows)
    assert data.reason == "found images: a 'messages' column with image parts"


def test_llava_style_placeholders_must_match_the_images(shapes):
    folder, rows = shapes
    good = {"images": [rows[0]["image"], rows[1]["image"]],
            "conversations": [{"from": "human", "value": "<image>\nLeft. <image>\nRight. Same colour?"},
                              {"from": "gpt", "value": "no"}]}
    bad = {"images": [rows[2]["image"]], "conversations": [{"from": "human", "value": "<image> and <image>?"},
                                                           {"from": "gpt", "value": "no"}]}
    path = write_jsonl(folder / "llava.jsonl", [good, bad])
    data = load_local([str(path)], _cfg(path))
    assert len(data.rows) == 1 and len(data.rows[0]["images"]) == 2
    assert data.rows[0]["messages"][0]["content"] == [
        {"type": "image"}, {"type": "text", "text": "Left."}, {"type": "image"},
        {"type": "text", "text": "Right. Same colour?"}]
    assert data.dropped == {"<image> placeholders and images differ in number": 1}
    assert data.drop_examples == {"<image> placeholders and images differ in number": ["row 1"]}


def test_imagefolder_with_metadata_csv_captions(shapes):
    folder, rows = shapes
    with open(folder / "metadata.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file_name", "text"])
        writer.writerows([r["image"], f"a {r['answer']} {r['shape']}"] for r in rows)
    data = load_local([str(folder)], _cfg(folder))  # the folder: its metadata file is the dataset file
    assert len(data.rows) == len(rows)
    assert data.rows[0]["messages"][0]["content"] == [{"type": "image"}, {"type": "text", "text": "Describe the image."}]
    assert data.rows[0]["messages"][1]["content"] == [{"type": "text", "text": f"a {rows[0]['answer']} {rows[0]['shape']}"}]


def test_urls_escaping_paths_symlinks_and_missing_images_are_field_errors(shapes, tmp_path):
    folder, rows = shapes
    outside = tmp_path.parent / f"outside-{tmp_path.name}.png"
    outside.write_bytes((folder / rows[0]["image"]).read_bytes())
    (folder / "link.png").symlink_to(outside)
    try:
        cases = {"https://example.com/cat.png": "is a URL; image URLs are not fetched",
                 str(outside): "outside the allowed folders",
                 "link.png": "outside the allowed folders",
                 "../../../../etc/hostname": "outside the allowed folders",
                 "missing.png": "does not exist"}
        for ref, expected in cases.items():
            path = write_jsonl(folder / "one.jsonl", [{"image": ref, "question": "q", "answer": "a"}])
            problems = check_data(_cfg(path))
            assert [p.field for p in problems] == ["local_datasets"], (ref, problems)
            assert problems[0].message.startswith("row 0: ") and expected in problems[0].message, problems
    finally:
        outside.unlink()


def test_image_data_on_a_text_model_is_refused_naming_the_fix(shapes):
    folder, rows = shapes
    path = write_jsonl(folder / "data.jsonl", rows)
    problems = check_data(_cfg(path, model_name=BUNDLED_MODEL, packing=True))
    assert {p.field for p in problems} == {"model_name", "packing"}
    text_model = next(p for p in problems if p.field == "model_name")
    assert "is a text model" in text_model.message and "choose a vision-language model" in text_model.message


def test_is_dataset_image_on_text_data_is_refused(home):
    problems = check_data(TrainConfig(is_dataset_image=True))
    assert [(p.field, p.message.split(",")[0]) for p in problems] == [("is_dataset_image", "is on")]


def _llava_folder(path, image_size=336, patch=14, strategy="default", processor=None):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "image_token_index": 32000,
        "vision_feature_select_strategy": strategy,
        "vision_config": {"model_type": "clip_vision_model", "image_size": image_size, "patch_size": patch},
        "text_config": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}}))
    (path / "processor_config.json").write_text(json.dumps(processor or {"patch_size": patch}))
    return path


def test_detector_reads_configs_only(home, tmp_path):
    llava = detect_modality(str(_llava_folder(tmp_path / "llava")))
    assert (llava.kind, llava.vision_tower, llava.image_size, llava.patch_size, llava.image_tokens) == \
        (VISION, "clip_vision_model", 336, 14, 576)
    assert llava.summary() == ("Vision-language model (LlavaForConditionalGeneration), vision tower clip_vision_model, "
                               "images at 336×336 px in 14-px patches, 576 tokens per image.")
    assert detect_modality(BUNDLED_MODEL).kind == TEXT
    gemma = from_configs({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                          "mm_tokens_per_image": 256, "vision_config": {"model_type": "siglip_vision_model",
                                                                       "image_size": 896, "patch_size": 14}})
    assert (gemma.image_tokens, gemma.dynamic) == (256, "")
    qwen = from_configs({"architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
                         "vision_config": {"model_type": "qwen2_vl", "patch_size": 14, "spatial_merge_size": 2}},
                        {"size": {"shortest_edge": 56 * 56}})
    assert qwen.is_vision and qwen.dynamic.startswith("grows with the image's pixels")
    text = from_configs({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    assert text.kind == TEXT and text.summary() == "Text model (LlamaForCausalLM): trains on chat or text data."


def test_max_seq_length_below_the_image_tokens_is_a_field_error(shapes, tmp_path):
    folder, rows = shapes
    model = _llava_folder(tmp_path / "tiny", image_size=32, patch=8, strategy="full")
    path = write_jsonl(folder / "data.jsonl", rows)
    assert check_data(_cfg(path, model_name=str(model), max_seq_length=64)) == []
    problems = check_data(_cfg(path, model_name=str(model), max_seq_length=IMAGE_TOKENS))
    assert [p.field for p in problems] == ["max_seq_length"]
    assert "one image takes 16 tokens" in problems[0].message and "the <image> run would be cut" in problems[0].message


def test_image_bytes_as_the_datasets_image_feature_stores_them_in_parquet(shapes):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder, rows = shapes
    table = pa.table({"image": [{"bytes": (folder / r["image"]).read_bytes(), "path": None} for r in rows],
                      "question": [r["question"] for r in rows], "answer": [r["answer"] for r in rows]})
    pq.write_table(table, folder / "train.parquet")
    data = load_local([str(folder / "train.parquet")], _cfg(folder / "train.parquet"))
    assert len(data.rows) == len(rows)
    assert data.rows[0]["images"] == [(folder / rows[0]["image"]).read_bytes()]  # bytes travel as they are


def test_an_audiofolder_file_name_column_is_not_taken_for_images():
    from trainer_core.data import images

    assert not images.has_images([{"file_name": "clips/a.wav", "transcription": "hello"}])
    assert images.has_images([{"file_name": "pics/a.PNG", "text": "a red square"}])
