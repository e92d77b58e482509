"""The key gate's transcription route (issue 22): POST /v1/audio/transcriptions reaches the engine only with the key,
as a multipart form naming a served speech model, under the clip size limit, and unchanged; a chat model is not
asked to transcribe, nor a speech model to chat. Over a fake inner app that records the raw body it got."""
from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from trainer_core.serving.gate import GateConfig, KeyGate, multipart_fields
from trainer_core.serving.spec import hash_key

KEY = "speech-key-1"
AUTH = {"Authorization": f"Bearer {KEY}"}
CLIP = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(256)) * 4  # bytes the gate must pass on untouched


class Inner:
    def __init__(self):
        self.seen: list[tuple[str, bytes, dict]] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.seen.append((scope["path"], body, dict(scope["headers"])))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"text": "heard"}'})


def gate(max_audio: int = 1 << 20):
    inner = Inner()
    config = GateConfig(key_hash=hash_key(KEY), models={"whisper-tuned": "", "smollm2": ""},
                        speech_models=["whisper-tuned"], max_audio_bytes=max_audio)
    return inner, TestClient(KeyGate(inner, config))


def post_clip(client, model="whisper-tuned", clip=CLIP, headers=AUTH, **extra):
    return client.post("/v1/audio/transcriptions", headers=headers, data={"model": model, **extra},
                       files={"file": ("clip.wav", clip, "audio/wav")})


def test_a_clip_for_a_served_speech_model_reaches_the_engine_in_a_form_the_gate_wrote():
    inner, client = gate()
    response = post_clip(client, language="en", temperature="0")
    assert response.status_code == 200 and response.json() == {"text": "heard"}
    [(path, body, headers)] = inner.seen
    fields = multipart_fields(headers[b"content-type"].decode(), body)
    # what the gate checked, and nothing else: OpenAI's optional fields are accepted and left out
    assert path == "/v1/audio/transcriptions" and fields == {"model": "whisper-tuned", "file": CLIP}
    assert headers[b"content-type"].startswith(b"multipart/form-data; boundary=studio-")
    assert headers[b"content-length"] == str(len(body)).encode()


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}])
def test_no_or_wrong_key_is_401(headers):
    inner, client = gate()
    assert post_clip(client, headers=headers).status_code == 401
    assert inner.seen == []


@pytest.mark.parametrize("case, request_kwargs, status, words", [
    ("a model not served", {"model": "whisper-large"}, 404, ("'whisper-large' is not served here", "whisper-tuned")),
    ("a chat model", {"model": "smollm2"}, 400, ("'smollm2' writes text and does not transcribe",
                                                 "/v1/chat/completions")),
])
def test_the_model_must_be_a_served_speech_model(case, request_kwargs, status, words):
    inner, client = gate()
    response = post_clip(client, **request_kwargs)
    assert response.status_code == status, case
    message = response.json()["error"]["message"]
    assert all(w in message for w in words), message
    assert inner.seen == []


def test_a_body_that_is_not_a_form_or_has_no_clip_is_400():
    inner, client = gate()
    response = client.post("/v1/audio/transcriptions", headers=AUTH, json={"model": "whisper-tuned"})
    assert response.status_code == 400 and "multipart/form-data" in response.json()["error"]["message"]
    response = send(client, *form((MODEL, b"whisper-tuned"), ('Content-Disposition: form-data; name="language"', b"en")))
    assert response.status_code == 400 and "no 'file' field" in response.json()["error"]["message"]
    assert inner.seen == []


def test_a_clip_over_the_limit_is_413_before_the_engine():
    inner, client = gate(max_audio=2048)
    response = post_clip(client, clip=bytes(4096))
    assert response.status_code == 413 and "at most 2,048" in response.json()["error"]["message"]
    assert inner.seen == []


def test_a_speech_model_is_not_asked_to_chat():
    inner, client = gate()
    response = client.post("/v1/chat/completions", headers=AUTH,
                           json={"model": "whisper-tuned", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 400
    assert "transcribes audio and does not write answers" in response.json()["error"]["message"]
    assert inner.seen == []


def form(*parts: tuple[str, bytes], boundary: str = "b0undary") -> tuple[bytes, str]:
    """A multipart body from raw (headers, body) parts, written by hand as a hostile client would."""
    body = b"".join(f"--{boundary}\r\n".encode() + head.encode() + b"\r\n\r\n" + data + b"\r\n"
                    for head, data in parts)
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


MODEL = 'Content-Disposition: form-data; name="model"'
FILE = 'Content-Disposition: form-data; name="file"; filename="a.wav"'


def send(client, body: bytes, content_type: str, extra_headers: list | None = None):
    headers = [("authorization", f"Bearer {KEY}"), ("content-type", content_type), *(extra_headers or [])]
    return client.post("/v1/audio/transcriptions", content=body, headers=headers)


@pytest.mark.parametrize("case, parts, words", [
    # the engine's parser keeps the last of a repeated field, the gate's kept the first: a second model was loaded
    ("a second model field", [(MODEL, b"whisper-tuned"), (MODEL, b"/any/folder"), (FILE, CLIP)], "twice"),
    ("two Content-Disposition headers", [(MODEL + "\r\nContent-Disposition: form-data; name=\"x\"",
                                          b"whisper-tuned"), (FILE, CLIP)], "header twice"),
    ("a base64 transfer encoding", [(MODEL + "\r\nContent-Transfer-Encoding: base64", b"d2hpc3Blci10dW5lZA=="),
                                    (FILE, CLIP)], "transfer encoding"),
    ("an RFC 2231 name", [("Content-Disposition: form-data; name*=UTF-8''model", b"whisper-tuned"), (FILE, CLIP)],
     "plain name"),
    ("an unknown field", [(MODEL, b"whisper-tuned"), (FILE, CLIP), ('Content-Disposition: form-data; name="load"',
                                                                    b"x")], "unknown form field(s) 'load'"),
    ("the clip as text", [(MODEL, b"whisper-tuned"), ('Content-Disposition: form-data; name="file"', CLIP)],
     "sent as a file"),
    ("not audio", [(MODEL, b"whisper-tuned"), (FILE, b"#!/bin/sh\necho hi\n")], "not an audio clip"),
    ("a part without headers", [("", b"whisper-tuned"), (FILE, CLIP)], "without a colon"),
])
def test_a_form_another_parser_could_read_otherwise_is_refused(case, parts, words):
    inner, client = gate()
    response = send(client, *form(*parts))
    assert response.status_code == 400, (case, response.text)
    assert words in response.json()["error"]["message"], (case, response.json())
    assert inner.seen == []


def test_two_content_type_headers_are_refused():
    inner, client = gate()
    body, content_type = form((MODEL, b"whisper-tuned"), (FILE, CLIP))
    response = send(client, body, content_type, [("content-type", "multipart/form-data; boundary=other")])
    assert response.status_code == 400 and "one Content-Type header" in response.json()["error"]["message"]
    assert inner.seen == []


def test_a_form_of_many_parts_or_huge_part_headers_is_refused_without_parsing_it():
    """Hostile review: 494,000 empty parts took the standard library's MIME parser 217 s on the event loop."""
    inner, client = gate(max_audio=4 << 20)
    many, content_type = form(*[('Content-Disposition: form-data; name="x"', b"")] * 40_000)
    response = send(client, many, content_type)
    assert response.status_code == 400 and "more than 12 fields" in response.json()["error"]["message"]
    huge = 'Content-Disposition: form-data; name="model"' + "; a=b" * 20_000
    response = send(client, *form((huge, b"whisper-tuned"), (FILE, CLIP)))
    assert response.status_code == 400 and "longer than 4,096 bytes" in response.json()["error"]["message"]
    assert inner.seen == []


def test_a_clip_of_the_full_size_fits_with_its_form_and_a_larger_one_names_the_clip():
    inner, client = gate(max_audio=64 << 10)
    assert post_clip(client, clip=CLIP + bytes((64 << 10) - len(CLIP))).status_code == 200  # exactly the limit
    response = post_clip(client, clip=CLIP + bytes(64 << 10))
    assert response.status_code == 413 and response.json()["error"]["message"].startswith("the clip is ")


def test_form_fields_are_read_by_name():
    body, content_type = form((MODEL, b"first"), (FILE, b"\x00\x01\r\n\xff"))
    assert multipart_fields(content_type, body) == {"model": "first", "file": b"\x00\x01\r\n\xff"}
    assert multipart_fields("application/json", b"{}") is None
    assert multipart_fields("multipart/form-data", body) is None  # no boundary
