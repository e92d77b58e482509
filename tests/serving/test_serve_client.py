"""The OpenAI-API client against a fake server speaking HTTP on a real socket: streaming, stats, errors,
cancel."""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trainer_core.config import FieldError
from trainer_core.serving import client
from trainer_core.serving.client import Sampling, ServeError, health, list_models, stream_chat

KEY = "k-123"


def chunk(content=None, finish=None, usage=None) -> bytes:
    data = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": content},
                                                              "finish_reason": finish}]}
    if usage:
        data["usage"] = usage
    return f"data: {json.dumps(data)}\n\n".encode()


class FakeServer:
    """Answers each request with ``script(handler, body)``; records request bodies and headers."""

    def __init__(self, script):
        self.script = script
        self.requests: list[tuple[str, dict, dict]] = []
        self.release = threading.Event()  # lets a stalled answer finish at teardown
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                outer.requests.append((self.path, dict(self.headers), {}))
                outer.script(self, {})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, dict(self.headers), body))
                outer.script(self, body)

            def send_json(self, status, data):
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def start_sse(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve():
    servers = []

    def make(script):
        servers.append(FakeServer(script))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def streamed(handler, body, pieces=("Hel", "lo", "!"), usage=None):
    handler.start_sse()
    handler.wfile.write(chunk())  # the role chunk: no content
    for p in pieces:
        handler.wfile.write(chunk(p))
        handler.wfile.flush()
    handler.wfile.write(chunk(finish="stop", usage=usage))
    handler.wfile.write(b"data: [DONE]\n\n")


def test_stream_yields_pieces_and_stats_with_usage_tokens(serve):
    server = serve(lambda h, b: streamed(h, b, usage={"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}))
    messages = [{"role": "user", "content": "hi"}]
    stream = stream_chat(server.url, KEY, "m1", messages, Sampling(max_new_tokens=7, seed=3))
    assert stream.stats is None
    assert list(stream) == ["Hel", "lo", "!"]
    assert stream.text == "Hello!"
    stats = stream.stats
    assert stats.tokens == 4 and stats.finish_reason == "stop"  # usage wins over the 3 pieces
    assert stats.ttft_s is not None and 0 <= stats.ttft_s <= stats.total_s
    assert stats.tokens_per_s is None or stats.tokens_per_s > 0
    path, headers, body = server.requests[0]
    assert path == "/v1/chat/completions" and headers["Authorization"] == f"Bearer {KEY}"
    assert body == {"model": "m1", "messages": messages, "stream": True, "stream_options": {"include_usage": True},
                    "temperature": 0.0, "top_p": 1.0, "max_tokens": 7, "top_k": 0, "min_p": 0.0,
                    "repetition_penalty": 1.0, "seed": 3}


def test_tokens_counted_from_pieces_without_usage_and_length_finish(serve):
    def script(h, b):
        h.start_sse()
        for p in ("a", "b"):
            h.wfile.write(chunk(p))
        h.wfile.write(chunk(finish="length"))  # no [DONE]: transformers serve ends the stream like this

    stream = stream_chat(serve(script).url, KEY, "m", [], Sampling())
    assert "".join(stream) == "ab"
    assert stream.stats.tokens == 2 and stream.stats.finish_reason == "length"


def test_sampling_to_body_and_seed_none():
    body = Sampling(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, repetition_penalty=1.1,
                    max_new_tokens=12, seed=None).to_body()
    assert body == {"temperature": 0.7, "top_p": 0.9, "max_tokens": 12, "top_k": 40, "min_p": 0.05,
                    "repetition_penalty": 1.1}


def test_sampling_validate_names_each_bad_field():
    assert Sampling().validate() == []
    bad = Sampling(temperature=float("nan"), top_p=0.0, top_k=-1, min_p=1.5, repetition_penalty=0,
                   max_new_tokens=0, seed=-2)
    assert [e.field for e in bad.validate()] == ["temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                                 "max_new_tokens", "seed"]
    assert Sampling(max_new_tokens=True).validate() == [
        FieldError("max_new_tokens", "a whole number from 1 to 32,768, not True")]
    with pytest.raises(ServeError, match="temperature"):
        stream_chat("http://127.0.0.1:9/v1", KEY, "m", [], Sampling(temperature=3))


@pytest.mark.parametrize("status,body,words", [
    (401, {"error": {"message": "missing or wrong API key"}}, "refused the API key (401)"),
    (404, {"error": {"message": "model 'zz' is not served here; served: m1"}}, "does not serve 'zz' (404): model 'zz'"),
    (400, {"error": {"message": "the prompt has 3000 tokens but the context is 2048"}}, "context is 2048"),
    (500, {"detail": "boom"}, "failed (500): boom"),
])
def test_http_errors_become_clear_serve_errors(serve, status, body, words):
    server = serve(lambda h, b: h.send_json(status, body))
    with pytest.raises(ServeError, match=words.replace("(", r"\(").replace(")", r"\)")) as caught:
        list(stream_chat(server.url, KEY, "zz", [], Sampling()))
    assert caught.value.status == status


def test_connection_refused_is_not_running():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(ServeError, match="no model server is running at .* start it again"):
        list(stream_chat(url, KEY, "m", [], Sampling()))
    assert health(url, KEY) is False
    with pytest.raises(ServeError, match="connection refused"):
        list_models(url, KEY)


def test_server_dying_mid_answer(serve):
    def script(h, b):
        h.start_sse()
        h.wfile.write(chunk("partial"))
        h.wfile.flush()
        h.connection.shutdown(socket.SHUT_RDWR)  # the process died: the stream ends with no finish reason

    stream = stream_chat(serve(script).url, KEY, "m", [], Sampling())
    assert next(stream) == "partial"
    with pytest.raises(ServeError, match="stopped mid-answer"):
        next(stream)
    assert stream.stats.tokens == 1 and stream.stats.finish_reason is None


def test_error_event_inside_the_stream(serve):
    def script(h, b):
        h.start_sse()
        h.wfile.write(b'data: {"error": "CUDA out of memory"}\n\n')

    with pytest.raises(ServeError, match="failed mid-answer: CUDA out of memory"):
        list(stream_chat(serve(script).url, KEY, "m", [], Sampling()))


def test_silent_server_times_out(serve):
    server = serve(lambda h, b: server.release.wait(30))
    with pytest.raises(ServeError, match=r"did not send the start of an answer within 0.3 s"):
        list(stream_chat(server.url, KEY, "m", [], Sampling(), timeout_s=0.3))


def test_cancel_stops_a_stream_waiting_for_its_first_token(serve):
    server = serve(lambda h, b: server.release.wait(30))  # still "loading": sends nothing
    cancel = threading.Event()
    stream = stream_chat(server.url, KEY, "m", [], Sampling(), timeout_s=60, cancel=cancel)
    threading.Timer(0.2, cancel.set).start()
    assert list(stream) == []  # returned on cancel, long before the 60 s timeout
    assert stream.stats.finish_reason is None and stream.stats.tokens == 0 and stream.stats.ttft_s is None


def test_cancel_between_pieces_keeps_what_came(serve):
    def script(h, b):
        h.start_sse()
        h.wfile.write(chunk("one"))
        h.wfile.flush()
        server.release.wait(30)

    server = serve(script)
    cancel = threading.Event()
    stream = stream_chat(server.url, KEY, "m", [], Sampling(), cancel=cancel)
    assert next(stream) == "one"
    cancel.set()
    assert list(stream) == []
    assert stream.stats.tokens == 1 and stream.text == "one"


def test_list_models_and_health(serve):
    def script(h, b):
        if h.path == "/health":
            h.send_json(200, {"status": "ok"})
        else:
            h.send_json(200, {"object": "list", "data": [{"id": "base", "object": "model"}, {"id": "tuned"}]})

    server = serve(script)
    assert list_models(server.url, KEY) == ["base", "tuned"]
    assert health(server.url, KEY) is True
    assert [r[0] for r in server.requests] == ["/v1/models", "/health"]
    assert all(r[1]["Authorization"] == f"Bearer {KEY}" for r in server.requests)


def test_list_models_of_something_else(serve):
    server = serve(lambda h, b: h.send_json(200, {"hello": "world"}))
    with pytest.raises(ServeError, match="not answer with an OpenAI model list"):
        list_models(server.url, KEY)
    server401 = serve(lambda h, b: h.send_json(401, {"error": {"message": "no"}}))
    with pytest.raises(ServeError, match="401"):
        list_models(server401.url, "wrong")
    assert health(server401.url, "wrong") is False


def test_root_strips_v1():
    assert client._root("http://h:1/v1/") == "http://h:1"
    assert client._root("http://h:1") == "http://h:1"


@pytest.mark.parametrize("event", [b'data: {"choices": ["x"]}\n\n', b'data: {"choices": [{"delta": "x"}]}\n\n'])
def test_a_chunk_of_the_wrong_shape_is_an_error_not_a_hang(serve, event):
    """A choice that is not an object crashed the reader thread (AttributeError) without a word, and the
    consumer then waited for the next piece forever."""
    def script(h, b):
        h.start_sse()
        h.wfile.write(event)

    stream = stream_chat(serve(script).url, KEY, "m", [], Sampling(), timeout_s=5.0)
    stream._thread.join()  # the reader has ended: it must have left the consumer an error
    assert not stream._items.empty()
    with pytest.raises(ServeError, match="cannot read"):
        list(stream)
