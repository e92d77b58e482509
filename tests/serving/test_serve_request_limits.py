"""What a serve job's requests may ask and how long they live: an abandoned request ends (disconnect, timeout), the
operator's max_tokens cap, sampling values out of range and deep JSON are 400s naming the field, TLS settings, the
plain-HTTP warning."""
from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest
import uvicorn
from starlette.testclient import TestClient

from tests.support import wait_until
from trainer_core.config import BUNDLED_MODEL, FieldError
from trainer_core.specs.model_source import ModelSource
from trainer_core.serving import gate as gate_module
from trainer_core.serving.gate import GateConfig, KeyGate
from trainer_core.serving.spec import ServeSpec, hash_key, plain_http_warning

KEY = "secret-key-1"
AUTH = [(b"authorization", f"Bearer {KEY}".encode()), (b"content-type", b"application/json")]
BASE = ModelSource(model=BUNDLED_MODEL)


class SlowEngine:
    """An engine that starts answering (``stream``: the headers and one chunk first) and never finishes; it
    records the body it got and whether its task was cancelled (how the gate ends a generation)."""

    def __init__(self, stream: bool = False):
        self.stream = stream
        self.bodies: list[dict] = []
        self.started = threading.Event()
        self.cancelled = threading.Event()

    async def __call__(self, scope, receive, send):
        message = await receive()
        self.bodies.append(json.loads(message["body"]))
        try:
            if self.stream:
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"text/event-stream")]})
                await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
            self.started.set()
            await asyncio.Event().wait()  # generating forever
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


def make_gate(engine, translate: bool = True, **config) -> KeyGate:
    return KeyGate(engine, GateConfig(key_hash=hash_key(KEY), models={"tuned": ""}, translate_sampling=translate,
                                      **config))


def scope(path: str = "/v1/completions") -> dict:
    return {"type": "http", "method": "POST", "path": path, "headers": AUTH, "query_string": b""}


async def drive(gate: KeyGate, engine: SlowEngine, body: dict, disconnect: bool) -> list[dict]:
    """One request through the gate; with ``disconnect`` the client goes away once the engine has started."""
    gone = asyncio.Event()
    first = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        if first:
            return first.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    task = asyncio.ensure_future(gate(scope(), receive, send))
    if disconnect:
        while not engine.started.is_set():
            await asyncio.sleep(0.01)
        gone.set()
    await asyncio.wait_for(task, timeout=120)  # a gate that never ends the request fails here instead of hanging
    return sent


COMPLETION = {"model": "tuned", "prompt": "Once upon a time", "max_tokens": 8000}


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_disconnects_cancels_the_generation(stream):
    engine = SlowEngine(stream=stream)
    sent = asyncio.run(drive(make_gate(engine), engine, {**COMPLETION, "stream": stream}, disconnect=True))
    assert engine.cancelled.is_set()
    assert [m["type"] for m in sent] == (["http.response.start", "http.response.body"] if stream else [])


def test_a_request_past_its_timeout_is_ended_with_504():
    engine = SlowEngine()
    sent = asyncio.run(drive(make_gate(engine, request_timeout_s=0.05), engine, COMPLETION, disconnect=False))
    assert engine.cancelled.is_set()
    assert sent[0]["status"] == 504
    error = json.loads(sent[1]["body"])["error"]
    assert error["type"] == "timeout"
    assert error["message"].startswith("the request ran past this server's request timeout of 0.05 s")


def test_a_streamed_answer_past_its_timeout_ends_with_an_error_event():
    engine = SlowEngine(stream=True)
    sent = asyncio.run(drive(make_gate(engine, request_timeout_s=0.05), engine, {**COMPLETION, "stream": True},
                             disconnect=False))
    assert engine.cancelled.is_set()
    last = sent[-1]
    assert last["more_body"] is False and last["body"].startswith(b'data: {"error": {"message": "the request ran past')


def test_a_real_socket_closed_mid_answer_cancels_the_generation():
    """The same through uvicorn on loopback: the client closes its connection during a non-streaming answer."""
    engine = SlowEngine()
    server = uvicorn.Server(uvicorn.Config(make_gate(engine), log_level="warning", lifespan="off"))
    sock = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, what="uvicorn")
        body = json.dumps(COMPLETION).encode()
        with socket.create_connection(sock.getsockname()) as client:
            client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                           + b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
                           + b"\r\n\r\n" + body)
            wait_until(engine.started.is_set, what="the engine to start")
        wait_until(engine.cancelled.is_set, what="the engine to be cancelled")
    finally:
        server.should_exit = True
        thread.join(timeout=10)


class Inner:
    """An engine answering at once with what it got."""

    def __init__(self):
        self.bodies: list[dict] = []

    async def __call__(self, scope, receive, send):
        self.bodies.append(json.loads((await receive())["body"]))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})


def client(translate: bool = True, **config):
    inner = Inner()
    return inner, TestClient(make_gate(inner, translate, **config))


HEADERS = {"Authorization": f"Bearer {KEY}"}


@pytest.mark.parametrize("translate", [True, False])
@pytest.mark.parametrize("asked,expected", [(8000, 2048), (2048, 2048), (100, 100), (None, None)])
def test_max_tokens_is_capped_by_the_operator(translate, asked, expected):
    inner, http = client(translate, max_tokens_cap=2048)
    body = {"model": "tuned", "prompt": "hi", **({"max_tokens": asked} if asked else {})}
    assert http.post("/v1/completions", json=body, headers=HEADERS).status_code == 200
    [seen] = inner.bodies
    if expected is None:  # no max_tokens: transformers serve's default (1024, under the cap); vLLM's would be the context
        expected = gate_module.ENGINE_DEFAULT_MAX_TOKENS if translate else 2048
    if translate:
        assert json.loads(seen["generation_config"])["max_new_tokens"] == expected
    else:
        assert seen["max_tokens"] == expected


def test_a_cap_below_the_engine_default_applies_to_requests_naming_none():
    inner, http = client(True, max_tokens_cap=64)
    http.post("/v1/completions", json={"model": "tuned", "prompt": "hi"}, headers=HEADERS)
    assert json.loads(inner.bodies[0]["generation_config"])["max_new_tokens"] == 64


@pytest.mark.parametrize("field,value,message", [
    ("top_k", -1, "top_k must be a whole number from 0 to 100000, not -1"),
    ("top_k", 2.5, "top_k must be a whole number from 0 to 100000, not 2.5"),
    ("repetition_penalty", 0, "repetition_penalty must be a number greater than 0 and at most 10, not 0"),
    ("temperature", -1, "temperature must be a number from 0 to 2, not -1"),
    ("temperature", 1e308, "temperature must be a number from 0 to 2, not 1e+308"),
    ("temperature", "hot", "temperature must be a number from 0 to 2, not 'hot'"),
    ("top_p", 0, "top_p must be a number greater than 0 and at most 1, not 0"),
    ("min_p", 1.5, "min_p must be a number from 0 to 1, not 1.5"),
])
@pytest.mark.parametrize("translate", [True, False])
def test_sampling_values_out_of_range_are_400_naming_the_field(translate, field, value, message):
    inner, http = client(translate)
    body = {"model": "tuned", "messages": [{"role": "user", "content": "hi"}], field: value}
    response = http.post("/v1/chat/completions", json=body, headers=HEADERS)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == message
    assert inner.bodies == []


@pytest.mark.parametrize("depth", [100_000, 65])
def test_deeply_nested_json_is_a_400(depth):
    inner, http = client()
    raw = '{"model": "tuned", "prompt": "hi", "x": ' + "[" * depth + "]" * depth + "}"
    response = http.post("/v1/completions", content=raw, headers={**HEADERS, "Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "the request body nests deeper than 64 levels"
    assert inner.bodies == []


def test_nesting_a_chat_request_needs_is_accepted():
    inner, http = client()
    body = {"model": "tuned", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "x": json.loads("[" * 50 + "]" * 50)}
    assert http.post("/v1/chat/completions", json=body, headers=HEADERS).status_code == 200


# ---------------------------------------------------------------- the spec's cap, timeout and TLS fields
def test_cap_timeout_and_tls_are_validated_with_field_errors(home, tmp_path):
    assert ServeSpec(sources=[BASE], api_key_hash=hash_key("k")).max_tokens_cap == 2048
    assert ServeSpec(sources=[BASE], api_key_hash=hash_key("k")).request_timeout_s == 300
    bad = ServeSpec(sources=[BASE], api_key_hash=hash_key("k"), max_tokens_cap=0, request_timeout_s=-1,
                    tls_certfile="/etc/ssl/certs/outside.pem", consumer="nobody")
    errors = {e.field: e.message for e in bad.validate()}
    assert errors["max_tokens_cap"] == "a whole number of tokens from 1 to 1,048,576, not 0"
    assert errors["request_timeout_s"] == "0 (never) or 5 to 86,400 seconds, not -1"
    assert errors["tls_keyfile"] == "tls_certfile is set: give both the certificate and its private key"
    assert errors["tls_certfile"].startswith("/etc/ssl/certs/outside.pem resolves to")
    assert errors["tls_certfile"].endswith(": put the file under the data root or an allowed folder")
    assert "consumer" in errors
    cert, key = home / "cert.pem", home / "key.pem"
    missing = ServeSpec(sources=[BASE], api_key_hash=hash_key("k"), tls_certfile=str(cert), tls_keyfile=str(key))
    assert [e.field for e in missing.validate()] == ["tls_certfile", "tls_keyfile"]
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    good = ServeSpec(sources=[BASE], api_key_hash=hash_key("k"), tls_certfile=str(cert), tls_keyfile=str(key),
                     request_timeout_s=0, max_tokens_cap=64)
    assert good.validate() == [] and good.scheme == "https"


def test_plain_http_off_loopback_is_warned_about():
    for host in ("127.0.0.1", "::1", "localhost"):
        assert plain_http_warning(host) == ""
    for host in ("0.0.0.0", "::", "10.0.0.2", "gpu-box.lan"):
        assert plain_http_warning(host).startswith(f"{host} is reachable from the network and the server speaks "
                                                   "plain HTTP")


# ---------------------------------------------------------------- transformers serve stops a cancelled answer
CANCEL_SCRIPT = r"""
import asyncio, json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from trainer_core.worker.serve_generate import CancellableGenerationState

tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
manager = CancellableGenerationState().get_manager("m")
inputs = tokenizer("Once upon a time", return_tensors="pt")
wanted = int(sys.argv[2])
config = GenerationConfig(max_new_tokens=wanted, min_new_tokens=wanted, do_sample=False,
                          pad_token_id=tokenizer.eos_token_id)

async def scenario():
    task = asyncio.ensure_future(manager.generate_non_streaming(model, tokenizer, inputs, config, "r1"))
    while "r1" not in manager.running or manager.running["r1"].steps == 0:
        await asyncio.sleep(0.01)
    stop = manager.running["r1"]
    task.cancel()
    try:
        await task
        outcome = "answered"
    except asyncio.CancelledError:
        outcome = "cancelled"
    await asyncio.wrap_future(manager.submit(lambda: None))  # the inference thread is free again
    return {"outcome": outcome, "steps": stop.steps, "running": list(manager.running)}

print(json.dumps(asyncio.run(scenario())))
"""


@pytest.mark.subprocess
def test_a_cancelled_non_streaming_generation_stops_on_the_inference_thread():
    """The engine half of the disconnect: transformers serve's non-streaming path runs generate() to
    max_new_tokens unless told; cancelling the awaiting task now ends it after the next token (in a
    subprocess: this process never imports torch)."""
    from tests.support import bundled_model_folder, run_python

    wanted = 4000  # minutes of CPU time if it ran to the end
    result = run_python(CANCEL_SCRIPT, str(bundled_model_folder()), str(wanted))
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts["outcome"] == "cancelled" and facts["running"] == []
    assert 1 <= facts["steps"] < wanted
