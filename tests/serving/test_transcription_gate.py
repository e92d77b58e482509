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


def test_a_clip_for_a_served_speech_model_reaches_the_engine_unchanged():
    inner, client = gate()
    response = post_clip(client)
    assert response.status_code == 200 and response.json() == {"text": "heard"}
    [(path, body, headers)] = inner.seen
    fields = multipart_fields(headers[b"content-type"].decode(), body)
    assert path == "/v1/audio/transcriptions" and fields == {"model": "whisper-tuned", "file": CLIP}
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
    response = client.post("/v1/audio/transcriptions", headers=AUTH, data={"model": "whisper-tuned"},
                           files={"other": ("x.txt", b"hi", "text/plain")})
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


def test_form_fields_are_read_by_name_and_a_repeated_field_keeps_the_first():
    boundary = "b0undary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nfirst\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nsecond\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
            "Content-Type: audio/wav\r\n\r\n").encode() + b"\x00\x01\r\n\xff" + f"\r\n--{boundary}--\r\n".encode()
    fields = multipart_fields(f"multipart/form-data; boundary={boundary}", body)
    assert fields == {"model": "first", "file": b"\x00\x01\r\n\xff"}
    assert multipart_fields("application/json", b"{}") is None
    assert multipart_fields("multipart/form-data", body) is None  # no boundary
