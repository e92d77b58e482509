"""Eval files with images, end to end (issue 20): the tiny LLaVA trained on coloured shapes (the recipe of
tests/vision/test_vision_playground.py), then an eval job on held-out image rows through the orchestrator, with its
base-model baseline: every question is answered WITH its image and scored by the text metrics; the tuned model's
exact match beats the base's; each per-sample row keeps a thumbnail of its image in the eval job's folder, and the
Evaluation tab of Run details (AppTest) shows it beside the question, reference and answer."""
from __future__ import annotations

import dataclasses
import json

import pytest
from PIL import Image

from tests.support import MODELS_CACHE, ROOT, wait_until
from tests.support.apptest import open_page
from tests.vision.test_vision_playground import vision_config
from tests.support.vision import QUESTION, shape_rows
from tests.support.data_rows import write_jsonl
from trainer_core.auth import access
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.jobs import evals
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus
from ui.state import get_orchestrator
from ui.text import safe

HELD_OUT = 12


@pytest.mark.train
@pytest.mark.subprocess
def test_a_vision_run_is_scored_on_held_out_images_against_its_base(app_home, tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp_path}:{ROOT / '.test-cache'}")
    monkeypatch.setenv("FINETUNE_STUDIO_MODELS", str(MODELS_CACHE))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    orch = get_orchestrator()
    cfg, held = vision_config(tmp_path)
    # samples during training with images: the same question about two held-out pictures of different colours
    # (blue, green), answered at the end; each answer names its own picture's colour, so each saw its image
    assert held[0]["answer"] != held[1]["answer"]
    cfg = dataclasses.replace(cfg, sample_prompts=[QUESTION, "What colour is this?"],
                              sample_images=[held[0]["image"], held[1]["image"]], sample_max_new_tokens=1)
    assert cfg.validate() == []
    run_id = orch.start(cfg)
    snap = orch.wait(run_id, timeout=400)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{orch.log_tail(run_id, 80)}"
    samples = sorted(orch.samples(run_id), key=lambda s: s.index)
    print(f"\nsamples at step 30 with their images ({held[0]['answer']}, {held[1]['answer']}): "
          f"{[s.text for s in samples]}")
    assert [(s.step, s.text) for s in samples] == [(30, held[0]["answer"]), (30, held[1]["answer"])]
    assert sorted(p.name for p in (paths.run_dir(run_id) / "samples" / "images").iterdir()) == ["0.png", "1.png"]

    folder = tmp_path / "held"  # images the run never saw, as a user's test file: relative paths beside it
    rows = shape_rows(folder, HELD_OUT, seed=2, prefix="held")
    data = write_jsonl(folder / "test.jsonl", rows)
    # One new token: each colour is one token, and 30 steps teach the tiny model the colour but not yet to end its
    # turn (with 3 it says "red Spelling"); the default metrics: exact, rouge, bleu and perplexity.
    spec = EvalSpec(source=ModelSource(run_id=run_id), data=str(data), max_new_tokens=1)
    started = evals.submit(orch, spec, access.Actor("me", access.Role.ADMIN))
    assert started.baseline_id and started.baseline_new
    for job in (started.job_id, started.baseline_id):
        wait_until(lambda job=job: orch.get_run(job).status.is_terminal(), timeout=300, what=f"eval {job}")
        assert orch.get_run(job).status is RunStatus.COMPLETED, orch.log_tail(job, 60)
    tuned = orch.eval_result(started.job_id).metrics
    base = orch.eval_result(started.baseline_id).metrics
    print(f"\nheld-out images ({HELD_OUT}): exact match base {base['exact']:.2f} -> tuned {tuned['exact']:.2f}; "
          f"ROUGE-L {base['rouge_l']:.2f} -> {tuned['rouge_l']:.2f}; BLEU {base['bleu']:.1f} -> {tuned['bleu']:.1f}; "
          f"perplexity {base['perplexity']:.1f} -> {tuned['perplexity']:.2f}")
    assert tuned["samples"] == base["samples"] == tuned["images"] == HELD_OUT
    assert tuned["exact"] >= 0.75 and tuned["exact"] >= base["exact"] + 0.5, (base, tuned)
    assert tuned["perplexity"] < base["perplexity"]

    lines = [json.loads(line) for line in (paths.run_dir(started.job_id) / "predictions.jsonl").read_text().splitlines()]
    assert [(line["prompt"], line["reference"]) for line in lines] == [(f"<image> {r['question']}", r["answer"])
                                                                        for r in rows]
    assert [line["image"] for line in lines] == [f"images/{i}.png" for i in range(HELD_OUT)]
    with Image.open(paths.run_dir(started.job_id) / lines[0]["image"]) as thumb:  # the picture the model saw
        assert thumb.size == (48, 48) and thumb.getpixel((0, 0)) == (255, 255, 255)
    assert sum(line["exact"] for line in lines) == round(tuned["exact"] * HELD_OUT)

    at = open_page("pages/run.py", detail_run_id=run_id)
    at.selectbox(key="evaltab_pick").set_value(started.job_id).run()
    assert not at.exception, at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert {"Exact match", "ROUGE-L", "BLEU", "Perplexity"} <= set(metrics), metrics
    assert any("Deltas against the base model" in c.value for c in at.caption)
    shown = [str(image.proto) for image in at.get("image")]
    assert sum("the image the model saw" in image for image in shown) == 1, "the picked eval sample's thumbnail"
    assert len(shown) == 3, shown  # and the Samples tab's two sample images, above the answers
    assert {safe("#1 What colour is the shape?"), safe("#2 What colour is this?")} <= {c.value for c in at.caption}


UNREADABLE = """
import sys
from trainer_core.evaluation.samples import Sample
from trainer_core.worker.vision_eval import ImageUnreadable, pictures

try:
    pictures(Sample(3, [], "red", images=(sys.argv[1],)))
except ImageUnreadable as exc:
    print(exc)
"""


@pytest.mark.subprocess
def test_an_image_that_cannot_be_opened_fails_the_eval_naming_its_row(tmp_path):
    from tests.support import run_python

    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")  # there, under the roots, with an image's name: the loader lets it through
    result = run_python(UNREADABLE, str(broken))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().startswith("data: test row 3: cannot read its image (cannot identify image file")
    assert result.stdout.strip().endswith("): replace or remove the file")
