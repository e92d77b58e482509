"""Images in chat requests at the key gate (issue 20): a served vision model takes image parts as base64 data: URLs
within the limits; an http(s) URL or a path is refused (the engine's loader would fetch or open it), as are too many
images, too large ones (bytes, or pixels read from the header), non-images, and any image sent to a text model."""
from __future__ import annotations

import base64
import io
import json
import struct
import zlib

import pytest
from PIL import Image
from starlette.testclient import TestClient

from tests.serving.test_serve_gate import AUTH, KEY, Inner
from trainer_core.serving.gate import GateConfig, KeyGate
from trainer_core.serving.spec import hash_key


def png(size=(8, 8), colour=(200, 20, 20), fmt="PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, fmt)
    return buffer.getvalue()


def data_url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def huge_png_header(width: int, height: int) -> bytes:
    """A tiny PNG file whose header claims ``width`` x ``height`` pixels (its data would fill gigabytes)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def image_part(url) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def chat(model: str, *parts: dict, text: str = "What colour is this?") -> dict:
    return {"model": model, "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}],
            "max_tokens": 4}


@pytest.fixture
def served():
    inner = Inner()
    config = GateConfig(key_hash=hash_key(KEY), models={"llava-tuned": "", "smollm2": ""}, max_body_bytes=4096,
                        vision_models=["llava-tuned"], vision_max_body_bytes=200_000, max_images=2,
                        max_image_bytes=50_000, max_image_pixels=512 * 512)
    return inner, TestClient(KeyGate(inner, config))


def refused(client, body, status=400) -> str:
    response = client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == status, response.text
    return response.json()["error"]["message"]


def test_a_vision_model_gets_a_data_url_image_unchanged(served):
    inner, client = served
    url = data_url(png())
    response = client.post("/v1/chat/completions", json=chat("llava-tuned", image_part(url)), headers=AUTH)
    assert response.status_code == 200, response.text
    assert inner.seen[-1][3]["messages"][0]["content"][0] == image_part(url)
    for fmt, mime in (("JPEG", "image/jpeg"), ("WEBP", "image/webp")):
        response = client.post("/v1/chat/completions", json=chat("llava-tuned", image_part(data_url(png(fmt=fmt), mime))),
                               headers=AUTH)
        assert response.status_code == 200, (fmt, response.text)


def test_a_text_model_sent_an_image_is_a_400_naming_it(served):
    inner, client = served
    message = refused(client, chat("smollm2", image_part(data_url(png()))))
    assert message == ("messages[0].content[0] is an image (or other media), but model 'smollm2' reads text only: "
                       "send text parts only, or ask a vision-language model (served here: llava-tuned)")
    assert inner.seen == []


@pytest.mark.parametrize("url,shown", [("http://169.254.169.254/latest/meta-data/x.png", "an http(s) URL"),
                                       ("https://example.com/cat.png", "an http(s) URL"),
                                       ("/etc/passwd", "not a data: URL"),
                                       ("file:///etc/passwd", "not a data: URL"),
                                       (base64.b64encode(png()).decode(), "not a data: URL")])
def test_only_data_urls_are_taken_the_server_never_fetches_or_opens(served, url, shown):
    inner, client = served
    message = refused(client, chat("llava-tuned", image_part(url)))
    assert message == (f"messages[0].content[0].image_url.url is {shown}: this server never fetches URLs or opens "
                       "files; send the image's bytes in the request as data:image/png;base64,<base64 of the file>")
    assert inner.seen == []


def test_bad_image_data_is_a_400_naming_the_part(served):
    _inner, client = served
    assert refused(client, chat("llava-tuned", image_part("data:image/png;base64,@@@not base64@@@"))) == \
        "messages[0].content[0].image_url.url: the data after 'base64,' is not valid base64"
    assert refused(client, chat("llava-tuned", image_part(data_url(b"just some text bytes")))) == \
        "messages[0].content[0]: the data is not an image Pillow can read (PNG, JPEG, WebP or GIF)"
    assert "must be a base64 image data: URL" in refused(client, chat("llava-tuned", image_part("data:text/plain,hi")))
    assert refused(client, chat("llava-tuned", image_part(data_url(png(fmt="BMP"), "image/bmp")))) == \
        "messages[0].content[0]: a BMP image; send a PNG, JPEG, WebP or GIF"
    assert "image_url.url must be a data: URL" in refused(client, chat("llava-tuned", {"type": "image_url"}))
    assert "this server takes images as" in refused(
        client, chat("llava-tuned", {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}))


def test_an_image_over_the_pixel_limit_is_refused_from_its_header(served):
    _inner, client = served
    claims = huge_png_header(20_000, 1_000)  # 20 Mpx from a 100-byte file
    assert len(claims) < 200
    assert refused(client, chat("llava-tuned", image_part(data_url(claims)))) == \
        "messages[0].content[0]: the image is 20,000 x 1,000 pixels; at most 262,144 pixels are accepted: resize it"
    bomb = huge_png_header(100_000, 100_000)  # past Pillow's own guard, which refuses to open it at all
    assert refused(client, chat("llava-tuned", image_part(data_url(bomb)))) == (
        "messages[0].content[0]: the image claims far more pixels than can be decoded safely; at most 262,144 pixels "
        "are accepted: resize it")
    assert "at most 262,144 pixels" in refused(client, chat("llava-tuned", image_part(data_url(png(size=(600, 600))))))


def test_an_image_over_the_byte_limit_is_a_413(served):
    _inner, client = served
    noisy = Image.frombytes("RGB", (150, 150), bytes(range(256)) * (150 * 150 * 3 // 256) + bytes(150 * 150 * 3 % 256))
    buffer = io.BytesIO()
    noisy.save(buffer, "PNG", compress_level=0)
    assert 50_000 < len(buffer.getvalue()) < 100_000
    message = refused(client, chat("llava-tuned", image_part(data_url(buffer.getvalue()))), status=413)
    assert message.startswith("messages[0].content[0]: the image is about ") and "at most 50,000" in message


def test_too_many_images_across_the_conversation(served):
    _inner, client = served
    part = image_part(data_url(png()))
    body = {"model": "llava-tuned", "messages": [
        {"role": "user", "content": [part, {"type": "text", "text": "this?"}]}, {"role": "assistant", "content": "red"},
        {"role": "user", "content": [part, part, {"type": "text", "text": "and these?"}]}]}
    assert refused(client, body) == ("the request holds more than 2 images, the most one request may carry: start a "
                                     "new conversation, or send fewer images")


def test_only_a_vision_model_request_may_use_the_room_kept_for_images(served):
    inner, client = served
    long_text = "word " * 2000  # 10 kB: over the 4 kB text limit, under the 200 kB vision limit
    assert refused(client, chat("smollm2", text=long_text), status=413).startswith(
        "the request body is ")
    response = client.post("/v1/chat/completions", json=chat("llava-tuned", image_part(data_url(png())), text=long_text),
                           headers=AUTH)
    assert response.status_code == 200, response.text
    over = client.post("/v1/chat/completions", content=json.dumps(chat("llava-tuned", text="x" * 250_000)),
                       headers={**AUTH, "content-type": "application/json"})
    assert over.status_code == 413


def test_a_server_without_a_vision_model_keeps_its_text_body_limit(tmp_path):
    config = GateConfig(key_hash=hash_key(KEY), models={"smollm2": ""}, max_body_bytes=4096)
    client = TestClient(KeyGate(Inner(), config))
    response = client.post("/v1/chat/completions", json=chat("smollm2", text="word " * 2000), headers=AUTH)
    assert response.status_code == 413
    assert "at most 4,096" in response.json()["error"]["message"]


def test_the_prompt_count_sees_image_placeholders_and_their_tokens():
    """serve.prompt_limits counts a vision prompt with the processor's template: each image part becomes the
    template's image placeholder plus the config's image_seq_length - 1 tokens (LLaVA's expansion)."""
    from types import SimpleNamespace

    from trainer_core.worker.serve import _surely_fits, context_length, text_of_images

    body = chat("llava-tuned", image_part(data_url(png())), image_part(data_url(png())))
    messages, extra = text_of_images(body["messages"], SimpleNamespace(image_seq_length=16))
    assert messages == [{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                                     {"type": "text", "text": "What colour is this?"}]}]
    assert extra == 30
    assert not _surely_fits(body, 1_000_000)  # an image's tokens are not bounded by its bytes: always counted
    assert _surely_fits(chat("smollm2"), 4096)
    llava = SimpleNamespace(text_config=SimpleNamespace(max_position_embeddings=512))
    assert context_length(llava) == 512 and context_length(SimpleNamespace(max_position_embeddings=2048)) == 2048
