"""Showing a picture in the Playground (issue 20). The logic (ui/playground.py): an attached image is an image part
(a data: URL) for vision columns only, is checked with the serve gate's own limits, and a downloaded conversation
keeps a placeholder, not the bytes. End to end: the tiny LLaVA trained on coloured shapes, then on the Playground page
(AppTest) its base, its final model and the bundled text model side by side, loaded as one real serve job; a held-out
picture is attached to "What colour is this?" (it trained on "What colour is the shape?"); the tuned model names
its colour, the base does not, and the text model answers the text alone. Then the same endpoint as a client sees
it: the image as a data: URL answers as on the page; an http URL, or an image for the text model, is a 400."""
from __future__ import annotations

import base64
import hashlib
import io
import json

import httpx
import pytest
from PIL import Image
from streamlit.testing.v1 import AppTest

from tests.support import MODELS_CACHE, ROOT, wait_until
from tests.support.vision import build_tiny_vlm, draw_shape, shape_rows
from tests.support.data_rows import write_jsonl
from trainer_core.config import TrainConfig
from trainer_core.protocol.status import RunStatus
from trainer_core.serving.gate import MAX_IMAGES
from ui import playground as pg
from ui.state import get_orchestrator


def png_bytes(colour: str = "red", size: int = 48) -> bytes:
    import random

    buffer = io.BytesIO()
    draw_shape(colour, "circle", random.Random(0), size).save(buffer, "PNG")
    return buffer.getvalue()


# ====================================================================== the logic
def test_an_image_goes_to_vision_columns_as_a_data_url_and_to_text_columns_as_nothing():
    image, errors = pg.check_image("red.png", png_bytes())
    assert errors == [] and image.mime == "image/png"
    turns = [pg.Turn("What colour?", {"v": pg.Answer("v", "V", text="red"), "t": pg.Answer("t", "T", text="hm")},
                     image=image)]
    seen = pg.messages_for("", turns, "v", "And now?", vision=True)
    assert seen[0] == {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image.data_url()}},
                                                   {"type": "text", "text": "What colour?"}]}
    assert image.data_url().startswith("data:image/png;base64,iVBOR")
    assert seen[1:] == [{"role": "assistant", "content": "red"}, {"role": "user", "content": "And now?"}]
    assert pg.messages_for("", turns, "t", "And now?", vision=False) == [
        {"role": "user", "content": "What colour?"}, {"role": "assistant", "content": "hm"},
        {"role": "user", "content": "And now?"}]
    fresh = pg.messages_for("", [], "v", "This?", vision=True, new_image=image)
    assert fresh[0]["content"][0]["type"] == "image_url"


def test_a_downloaded_conversation_keeps_a_placeholder_not_the_bytes():
    raw = png_bytes("blue")
    image, _ = pg.check_image("blue.png", raw)
    turns = [pg.Turn("What colour?", {"v": pg.Answer("v", "V", text="blue", status=pg.DONE)}, image=image)]
    lines = [json.loads(line) for line in pg.conversation_jsonl(turns).splitlines()]
    assert lines[0]["image"] == {"name": "blue.png", "mime": "image/png", "bytes": len(raw),
                                 "sha256": hashlib.sha256(raw).hexdigest()}
    assert "base64" not in pg.conversation_jsonl(turns)


def test_an_attachment_that_is_not_a_usable_image_names_the_fix():
    assert pg.check_image("notes.png", b"hello") == (None, [pg.FieldError(
        "image", "'notes.png' is not an image that can be read: attach a PNG, JPEG or WebP")])
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, "BMP")
    assert pg.check_image("x.bmp", buffer.getvalue())[1] == [
        pg.FieldError("image", "'x.bmp' is a BMP image: attach a PNG, JPEG or WebP")]
    huge = io.BytesIO()
    Image.new("1", (5000, 4000)).save(huge, "PNG")  # 20 Mpx, a few kB
    assert pg.check_image("big.png", huge.getvalue())[1] == [pg.FieldError(
        "image", "'big.png': the image is 5,000 x 4,000 pixels; at most 16,777,216 pixels are accepted: resize it")]
    image, _ = pg.check_image("red.png", png_bytes())
    full = [pg.Turn("q", image=image) for _ in range(MAX_IMAGES)]
    assert pg.check_image("red.png", png_bytes(), full)[1][0].message.startswith(
        f"this conversation already holds {MAX_IMAGES} images")


# ====================================================================== end to end
def vision_config(tmp_path) -> tuple[TrainConfig, list[dict]]:
    """The vision e2e's recipe (tests/vision/test_vision_train.py): 96 shapes, 30 steps; and held-out rows."""
    folder = tmp_path / "shapes"
    data = write_jsonl(folder / "train.jsonl", shape_rows(folder, 96, seed=1, prefix="train"))
    held_out = [{**r, "image": str(folder / r["image"])} for r in shape_rows(folder, 3, seed=5, prefix="held")]
    cfg = TrainConfig(run_name="colours", model_name=str(build_tiny_vlm()), local_datasets=[str(data)], max_steps=30,
                      batch_size=8, learning_rate=1e-2, warmup_steps=2, max_seq_length=64, logging_steps=10,
                      train_on_completions=True, finetune_vision_layers=True, lora_r=16, lora_alpha=32,
                      target_modules=[], random_seed=0)
    return cfg, held_out


@pytest.mark.train
@pytest.mark.subprocess
def test_the_tuned_model_names_the_colour_of_a_picture_shown_in_the_playground(app_home, tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp_path}:{ROOT / '.test-cache'}")
    monkeypatch.setenv("FINETUNE_STUDIO_MODELS", str(MODELS_CACHE))  # the bundled model, converted once per checkout
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    orch = get_orchestrator()
    cfg, held_out = vision_config(tmp_path)
    run_id = orch.start(cfg)
    snap = orch.wait(run_id, timeout=400)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{orch.log_tail(run_id, 80)}"

    at = AppTest.from_file(str(ROOT / "streamlit_app.py"), default_timeout=60)
    at.run()
    at.switch_page("pages/playground.py").run()
    at.radio(key="pg_count").set_value(3).run()
    at.selectbox(key="pg_base_0").set_value(run_id).run()  # column 1: the run's base (the untrained tiny LLaVA)
    assert at.selectbox(key="pg_run_1").value == run_id  # column 2: its final model
    at.selectbox(key="pg_kind_2").set_value("base").run()  # column 3: the bundled text model
    next(b for b in at.button if b.label == "Load models").click().run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    server = at.session_state["pg_server"]
    assert [c.vision for c in server["columns"]] == [True, True, False]
    wait_until(lambda: pg.server_state(orch, server["job"]).phase in (pg.READY, pg.FAILED), timeout=300,
               what="the server to load")
    state = pg.server_state(orch, server["job"])
    assert state.ready, f"{state.message}\n{state.log_tail}"

    at.run()
    at.number_input(key="pg_temperature").set_value(0.0)
    at.number_input(key="pg_max_new").set_value(3)
    answers = []
    for n, row in enumerate(held_out):
        if n:
            next(b for b in at.button if b.label == "New conversation").click().run()
        raw = open(row["image"], "rb").read()
        at.file_uploader(key=f"pg_image_{n}").set_value((f"held-{n}.png", raw, "image/png"))
        at.chat_input(key="pg_input").set_value("What colour is this?").run(timeout=180)
        assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
        turn = at.session_state["pg_turns"][-1]
        assert turn.image is not None and turn.image.data == raw
        base, tuned, text = (turn.answers[c.key] for c in server["columns"])
        assert [a.status for a in (base, tuned, text)] == [pg.DONE] * 3, (base, tuned, text)
        answers.append((row["answer"], base.text.strip().lower(), tuned.text.strip().lower()))
        assert len(at.get("image")) == 1  # the picture in the conversation
        assert "(text only: this model did not see the image)" in [c.value for c in at.caption]
    print("held-out colour answers (truth, base, tuned):", answers)
    tuned_right = sum(tuned.startswith(truth) for truth, _base, tuned in answers)
    base_right = sum(base.startswith(truth) for truth, base, _tuned in answers)
    assert tuned_right >= 2 and base_right == 0, answers
    assert pg.conversation_jsonl(at.session_state["pg_turns"]).count('"sha256"') == 1

    # the same server, as a client sees it: the serve job told the gate which of its models take images
    tuned_name, text_name = (state.models[c.key] for c in server["columns"][1:])
    auth = {"Authorization": f"Bearer {server['key']}"}

    def ask(model: str, url: str) -> httpx.Response:
        part = {"type": "image_url", "image_url": {"url": url}}
        return httpx.post(f"{state.url}/chat/completions", headers=auth, timeout=60, json={
            "model": model, "max_tokens": 3, "temperature": 0,
            "messages": [{"role": "user", "content": [part, {"type": "text", "text": "What colour is this?"}]}]})

    held = open(held_out[0]["image"], "rb").read()
    answer = ask(tuned_name, "data:image/png;base64," + base64.b64encode(held).decode())
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"].strip().lower() == \
        answers[0][2]  # the endpoint answers as the Playground did
    fetched = ask(tuned_name, "http://127.0.0.1:9/shape.png")
    assert fetched.status_code == 400 and "never fetches URLs" in fetched.json()["error"]["message"]
    blind = ask(text_name, "data:image/png;base64," + base64.b64encode(held).decode())
    assert blind.status_code == 400 and "reads text only" in blind.json()["error"]["message"]
    orch.stop(server["job"])
    orch.wait(server["job"], timeout=60)
