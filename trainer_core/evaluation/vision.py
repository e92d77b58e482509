"""Eval jobs on image rows (issue 20), dashboard side (no ML imports). A test file in any shape a vision run reads
(image + question + answer, messages with image parts, LLaVA style; trainer_core.data.images) is read by the loader
training uses, so every image is resolved and checked under the allowed roots the same way (a path or symlink out,
or a missing file, is a ``data`` error naming the row). Each question is answered WITH its image by the model's
processor (worker/vision_eval.py) and scored by the text metrics against the reference answer.

Per-sample results keep a small PNG thumbnail of the image in the eval job's own folder (``images/<index>.png``),
written by the worker: the Evaluation tab shows what the model saw even after the test file or its images are
moved, changed or deleted, images given as bytes (parquet) show too, and the page only ever opens files inside the
job's ``images`` folder, never a path taken from the test data.
"""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from trainer_core.config import FieldError
from trainer_core.data import DatasetError
from trainer_core.protocol import paths

if TYPE_CHECKING:
    from trainer_core.evaluation.samples import Sample
    from trainer_core.evaluation.spec import EvalSpec

THUMBNAILS = "images"  # the eval job's folder of per-sample thumbnails
THUMBNAIL_PX = 256  # the longest side of a stored thumbnail
IMAGES_KEY = "images"  # metrics: how many scored samples showed an image (the page then reads predictions.jsonl)


def source_errors(spec: "EvalSpec", samples: list["Sample"]) -> list[FieldError]:
    """Image rows need a model that sees them; the metrics that score answers are the text ones."""
    from trainer_core.specs import model_source

    if not any(s.images for s in samples):
        return []
    try:
        resolved = model_source.resolve(spec.source)
    except model_source.SourceError:
        return []  # JobSpec.validate names the missing source
    errors = []
    if not resolved.sees_images:
        errors.append(FieldError("source", f"{resolved.label} reads text only, but the test rows hold images: "
                                           "evaluate a vision run or a vision-language base model, or a test file "
                                           "without images"))
    wrong = [m for m in spec.metrics if m in ("preference_accuracy", "reward")]
    if wrong:
        errors.append(FieldError("metrics", f"{', '.join(wrong)} cannot score image rows: choose from exact, rouge, "
                                            "bleu, perplexity, judge"))
    if spec.lm_eval_tasks and resolved.sees_images:
        errors.append(FieldError("lm_eval_tasks", "lm-evaluation-harness tasks are text benchmarks: clear "
                                                  "lm_eval_tasks for an eval on image rows"))
    return errors


def with_images(spec: "EvalSpec", digest: str) -> str:
    """The test data's fingerprint with every image's bytes folded in when the rows hold images (a changed picture
    under the same file name is another test set); ``digest`` as it is otherwise (text rows, a hub split: its
    id, subset and split are its key)."""
    from trainer_core.evaluation import samples as eval_samples

    if eval_samples.data_kind(spec.data) == "hub":
        return digest
    data = eval_samples.load_rows(dataclasses.replace(spec, max_samples=0))
    if data.format != "vision":
        return digest
    hashed = hashlib.sha256(f"vision-eval|{digest}".encode())
    for row in data.rows:
        for image in row["images"]:
            hashed.update(image_bytes(image))
    return hashed.hexdigest()[:32]


def image_bytes(image) -> bytes:
    if isinstance(image, (bytes, bytearray)):
        return bytes(image)
    if isinstance(image, str):
        try:
            return Path(image).read_bytes()
        except OSError as exc:
            raise DatasetError("data", f"image {Path(image).name!r} cannot be read ({exc}): restore it") from None
    return repr(image).encode()


def thumbnail_file(job_dir: Path, value) -> Path | None:
    """A stored thumbnail (predictions.jsonl's ``image``, relative to the job folder) only when it names a file
    inside the job's ``images`` folder; None for anything else (absent, escaping, a link out, gone)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        found = paths.resolve_inside(job_dir / value, [job_dir / THUMBNAILS])
    except paths.UnsafePathError:
        return None
    return found if found.is_file() else None
