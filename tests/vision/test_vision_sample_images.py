"""Samples during training with images (issue 20), dashboard side: ``sample_images`` names one image file per sample
prompt, checked at validation like any user path (under the allowed folders, a link out refused, the file there and
an image); Live and Run details show only thumbnails inside the run's samples/images folder."""
from __future__ import annotations

import os
import random

from db.entities import SampleRecord
from tests.support.vision import draw_shape
from trainer_core.config import TrainConfig
from trainer_core.protocol import paths
from ui import samples as ui_samples


def image_errors(**kw) -> list[str]:
    return [e.message for e in TrainConfig(**kw).validate() if e.field == "sample_images"]


def test_sample_images_are_files_under_the_allowed_folders_one_per_prompt(home, tmp_path):
    red = tmp_path / "red.png"
    draw_shape("red", "circle", random.Random(0)).save(red)
    assert image_errors(sample_prompts=["What colour?", "Hi"], sample_images=[str(red)]) == []
    assert image_errors(sample_prompts=["What colour?", "Hi"], sample_images=["", str(red)]) == []
    assert image_errors(sample_prompts=["What colour?"], sample_images=[str(red), str(red)]) == [
        "2 images for 1 sample prompt(s): image i goes with prompt i; drop the extra images or add prompts"]
    assert image_errors(sample_prompts=["q"], sample_images=[str(tmp_path / "gone.png")]) == [
        f"image 1 ({tmp_path / 'gone.png'}) does not exist: check the path"]
    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    assert image_errors(sample_prompts=["q"], sample_images=[str(notes)]) == [
        "image 1 (notes.txt) is not an image file: use a PNG, JPEG or WebP"]
    assert image_errors(sample_prompts=["q"], sample_images="red.png") == [
        'a list of image paths, one per sample prompt in order ("" for a text-only prompt)']
    outside = tmp_path.parent / f"{tmp_path.name}-outside.png"
    red_bytes = red.read_bytes()
    outside.write_bytes(red_bytes)
    try:
        os.symlink(outside, tmp_path / "link.png")
        for named in (str(outside), str(tmp_path / "link.png")):
            [message] = image_errors(sample_prompts=["q"], sample_images=[named])
            assert message.startswith("image 1: ") and "outside the allowed folders" in message, message
    finally:
        outside.unlink()


def test_the_samples_tab_shows_only_thumbnails_inside_the_runs_images_folder(home, tmp_path):
    run_id = "20260301-000000-abcdef"
    folder = paths.run_dir(run_id) / "samples" / "images"
    folder.mkdir(parents=True)
    draw_shape("red", "circle", random.Random(0)).save(folder / "0.png")
    secret = tmp_path / "secret.png"
    secret.write_bytes((folder / "0.png").read_bytes())
    os.symlink(secret, folder / "1.png")  # a link out of the run's folder is never shown
    samples = [SampleRecord(run_id=run_id, step=5, index=i, prompt=f"q{i}", text="red") for i in range(3)]
    assert ui_samples.image_files(samples) == {0: (folder / "0.png").resolve()}
    assert ui_samples.image_files([]) == {}
