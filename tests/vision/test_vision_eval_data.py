"""Eval files with images (issue 20), dashboard side: test rows in every shape a vision run reads become samples
whose prompt holds its image parts and whose images are resolved and checked under the allowed roots exactly as for
training; a missing image, a path or a symlink out is a ``data`` error naming the row; a text model is refused; the
baseline key covers the images' bytes; the page shows only thumbnails inside the eval job's own folder."""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.vision import QUESTION, as_messages, build_tiny_vlm, draw_shape, shape_rows
from tests.support.data_rows import write_jsonl
from trainer_core.config import BUNDLED_MODEL
from trainer_core.data import DatasetError
from trainer_core.evaluation import samples as eval_samples
from trainer_core.evaluation import vision as eval_vision
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.specs.model_source import ModelSource

USER_IMAGE = [{"type": "image"}, {"type": "text", "text": QUESTION}]


@pytest.fixture
def shapes(home, tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp_path}:{ROOT / '.test-cache'}")
    folder = tmp_path / "shapes"
    return folder, shape_rows(folder, 4, seed=3, prefix="test")


def spec(data, model: str | None = None, **kw) -> EvalSpec:
    return EvalSpec(source=ModelSource(model=model or str(build_tiny_vlm())), data=str(data), **kw)


def fields(errors) -> dict[str, str]:
    return {e.field: e.message for e in errors}


def test_every_vision_shape_becomes_samples_with_their_checked_images(shapes):
    folder, rows = shapes
    llava = [{"images": [r["image"]], "conversations": [{"from": "human", "value": f"<image>\n{r['question']}"},
                                                        {"from": "gpt", "value": r["answer"]}]} for r in rows]
    for name, shaped in (("flat", rows), ("messages", [as_messages(r) for r in rows]), ("llava", llava)):
        data = write_jsonl(folder / f"{name}.jsonl", shaped)
        assert fields(spec(data).validate()) == {}, name
        samples, left_out = eval_samples.load_samples(spec(data))
        assert left_out is None
        assert [s.reference for s in samples] == [r["answer"] for r in rows], name
        assert [s.images for s in samples] == [(str((folder / r["image"]).resolve()),) for r in rows], name
        assert samples[0].prompt == [{"role": "user", "content": USER_IMAGE}], name
        assert eval_samples.part_text(samples[0].prompt[0]["content"]) == f"<image> {QUESTION}"


def test_a_missing_image_or_a_path_or_symlink_out_of_the_roots_names_the_row(shapes, tmp_path):
    folder, rows = shapes
    missing = write_jsonl(folder / "missing.jsonl", [rows[0], {**rows[1], "image": "gone.png"}])
    found = fields(spec(missing).validate())
    assert found["data"].startswith("row 1: image 'gone.png' does not exist"), found
    outside = tmp_path.parent / f"{tmp_path.name}-outside.png"
    draw_shape("red", "circle", __import__("random").Random(0)).save(outside)
    try:
        out = write_jsonl(folder / "out.jsonl", [{**rows[0], "image": str(outside)}])
        found = fields(spec(out).validate())
        assert found["data"].startswith("row 0: ") and "outside the allowed folders" in found["data"], found
        os.symlink(outside, folder / "link.png")
        linked = write_jsonl(folder / "linked.jsonl", [rows[0], rows[1], {**rows[2], "image": "link.png"}])
        found = fields(spec(linked).validate())
        assert found["data"].startswith("row 2: ") and "outside the allowed folders" in found["data"], found
    finally:
        outside.unlink()
    url = write_jsonl(folder / "url.jsonl", [{**rows[0], "image": "https://example.com/a.png"}])
    assert "is a URL" in fields(spec(url).validate())["data"]


def test_image_rows_need_a_model_that_sees_them_and_the_text_metrics(shapes):
    folder, rows = shapes
    data = write_jsonl(folder / "flat.jsonl", rows)
    found = fields(spec(data, model=BUNDLED_MODEL).validate())
    assert found["source"] == ("SmolLM2-135M-Instruct (bundled) is a text model (LlamaForCausalLM), but data holds "
                               "images: choose a vision-language model (e.g. SmolVLM, Qwen2.5-VL, Gemma 3, LLaVA), "
                               "or a dataset without images"), found
    found = fields(spec(data, lm_eval_tasks=["hellaswag"]).validate())
    assert "clear lm_eval_tasks" in found["lm_eval_tasks"]
    # text rows on a vision model stay a text eval (no images, no vision checks)
    text = write_jsonl(folder / "text.jsonl", [{"instruction": "hi", "output": "hello"}])
    samples, _ = eval_samples.load_samples(spec(text))
    assert samples[0].images == () and samples[0].prompt == [{"role": "user", "content": "hi"}]


def test_the_baseline_key_covers_the_images_bytes(shapes):
    folder, rows = shapes
    data = write_jsonl(folder / "flat.jsonl", rows)
    before = eval_samples.fingerprint(spec(data))
    assert eval_samples.fingerprint(spec(data)) == before
    draw_shape("blue", "square", __import__("random").Random(9)).save(folder / rows[0]["image"])  # same name
    assert eval_samples.fingerprint(spec(data)) != before
    with pytest.raises(DatasetError, match="is a text model"):  # validation names it first (field source)
        eval_samples.fingerprint(spec(data, model=BUNDLED_MODEL))


def test_the_page_shows_only_thumbnails_inside_the_jobs_images_folder(tmp_path):
    job = tmp_path / "job"
    (job / "images").mkdir(parents=True)
    (job / "images" / "0.png").write_bytes(b"png")
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"png")
    os.symlink(secret, job / "images" / "1.png")
    assert eval_vision.thumbnail_file(job, "images/0.png") == (job / "images" / "0.png").resolve()
    for value in ("images/1.png", "../secret.png", str(secret), "images/9.png", "", None, 3, "images/\x00.png"):
        assert eval_vision.thumbnail_file(job, value) is None, value


def test_a_vision_runs_eval_split_is_read_as_image_rows(shapes):
    from trainer_core.config import TrainConfig
    from trainer_core.protocol import paths

    folder, _ = shapes
    rows = shape_rows(folder, 10, seed=4, prefix="split")
    data = write_jsonl(folder / "train.jsonl", rows)
    run_id = "20260301-000000-0a0b0c"
    cfg = TrainConfig(model_name=str(build_tiny_vlm()), local_datasets=[str(data)], eval_fraction=0.3, max_seq_length=64)
    paths.run_dir(run_id).mkdir(parents=True)
    (paths.run_dir(run_id) / "config.yaml").write_text(cfg.to_yaml())
    split = spec(f"eval_split:{run_id}")
    assert fields(split.validate()) == {}
    samples, _ = eval_samples.load_samples(split)
    assert len(samples) == 3 and all(len(s.images) == 1 and s.images[0].startswith(str(folder)) for s in samples)
    assert {s.reference for s in samples} <= {r["answer"] for r in rows}
    assert samples[0].prompt[0]["content"] == USER_IMAGE


def test_an_eval_sees_the_images_at_its_runs_image_max_side_and_its_baseline_too(shapes):
    from trainer_core.config import TrainConfig
    from trainer_core.jobs import evals
    from trainer_core.protocol import paths

    folder, rows = shapes
    data = write_jsonl(folder / "flat.jsonl", rows)
    run_id = "20260301-000000-0d0e0f"
    cfg = TrainConfig(model_name=str(build_tiny_vlm()), local_datasets=[str(data)], max_seq_length=64,
                      image_max_side=224)
    paths.run_dir(run_id).mkdir(parents=True)
    (paths.run_dir(run_id) / "config.yaml").write_text(cfg.to_yaml())
    of_run = EvalSpec(source=ModelSource(run_id=run_id), data=str(data))
    assert evals.prepared(of_run).image_max_side == 224  # as the run trained on them
    assert evals.prepared(EvalSpec(source=ModelSource(run_id=run_id), data=str(data),
                                   image_max_side=512)).image_max_side == 512  # the spec's own wins
    assert evals.prepared(spec(data)).image_max_side == 0  # a base model has no run to take it from
    # the size the images are seen at is part of what a baseline is compared on
    assert eval_samples.settings_hash(spec(data, image_max_side=224)) != eval_samples.settings_hash(spec(data))
    assert eval_samples.settings_hash(spec(data, image_max_side=0)) == eval_samples.settings_hash(spec(data))
    for bad in (-1, 5, 9000, 1.5, "224"):
        assert "image_max_side" in fields(spec(data, image_max_side=bad).validate()), bad
    assert "image_max_side" not in fields(spec(data, image_max_side=28).validate())
