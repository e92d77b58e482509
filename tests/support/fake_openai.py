"""A fake OpenAI-compatible chat server for Playground tests: a real HTTP server on loopback, in a thread.

It speaks the part of the API the dashboard uses: ``GET /v1/models``, ``GET /health`` and
``POST /v1/chat/completions`` (``stream: true`` as server-sent events, ``data: {chunk}`` lines ending with
``data: [DONE]``; ``stream: false`` as one JSON body). Every request must carry ``Authorization: Bearer
<api_key>``, else 401 with an OpenAI-style error body.

What it answers is scripted per model (``answers``), and it can be told to misbehave:
* ``fail_status``: answer every chat request with this HTTP status (e.g. 401, 500);
* ``die_after``: per model, close the connection after that many chunks, without ``[DONE]`` (a server that
  died mid-answer);
* ``gate``: a ``threading.Event``; chunks after the first ``gate_after`` wait for it (the test observes a
  partial answer, then releases the rest; never released, it is a server stuck mid-answer);
* ``tool_calls``: per model, the calls (``{"name", "arguments"}``) it makes when a request offers ``tools`` and its
  last message is not a tool result: streamed as OpenAI's ``delta.tool_calls`` (id and name first, the arguments'
  JSON text in two pieces), ending with ``finish_reason: "tool_calls"``; after a tool result it answers text, with
  ``{tool}`` in the scripted answer replaced by the last result;
Requests it received are kept in ``requests`` (the parsed JSON bodies), so tests assert what was sent.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from db.entities import RunRecord
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol.status import JobKind, RunStatus
from trainer_core.serving.endpoint import Endpoint, ServedModel

CHUNK_WORDS = 1  # one word per chunk: an answer streams in as many chunks as it has words


class FakeOpenAI:
    def __init__(self, answers: dict[str, str], api_key: str = "sk-test-key"):
        self.answers = dict(answers)
        self.api_key = api_key
        self.fail_status: int | None = None
        self.die_after: dict[str, int] = {}
        self.gate: threading.Event | None = None
        self.gate_after = 1
        self.tool_calls: dict[str, list[dict]] = {}
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-openai", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> "FakeOpenAI":
        self._thread.start()
        return self

    def stop(self) -> None:
        if self.gate is not None:
            self.gate.set()  # a handler waiting on the gate must not outlive the test
        self._server.shutdown()
        self._server.server_close()

    def record(self, body: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(body)

    def chat_requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.requests if "messages" in r]

    def answer_for(self, model: str, messages: list[dict]) -> str:
        """The scripted answer; ``{last}`` in it is replaced by the last user message (a different answer per
        prompt, as prompt-set tables need)."""
        last = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        result = next((m["content"] for m in reversed(messages) if m.get("role") == "tool"), "")
        return self.answers[model].replace("{last}", last).replace("{tool}", result)

    def calls_for(self, model: str, body: dict) -> list[dict]:
        """The calls to make: the model's scripted ones when tools are offered and no tool result came last."""
        messages = body.get("messages") or [{}]
        return self.tool_calls.get(model, []) if body.get("tools") and messages[-1].get("role") != "tool" else []


def _handler(fake: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: pytest shows failures, not traffic
            return

        # ---- helpers
        def _json(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, kind: str) -> None:
            self._json(status, {"error": {"message": message, "type": kind, "code": status}})

        def _authorized(self) -> bool:
            if self.headers.get("Authorization") == f"Bearer {fake.api_key}":
                return True
            self._error(401, "Invalid or missing API key", "invalid_request_error")
            return False

        # ---- endpoints
        def do_GET(self) -> None:
            if self.path.rstrip("/") in ("/health", "/v1/health"):
                self._json(200, {"status": "ok"})
            elif not self._authorized():
                return
            elif self.path.rstrip("/") == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "fake"}
                                                            for m in fake.answers]})
            else:
                self._error(404, f"no route {self.path}", "not_found")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            fake.record(body)
            if not self._authorized():
                return
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._error(404, f"no route {self.path}", "not_found")
                return
            if fake.fail_status is not None:
                self._error(fake.fail_status, "the fake server was told to fail", "server_error")
                return
            model = body.get("model", "")
            if model not in fake.answers:
                self._error(404, f"The model {model!r} does not exist", "invalid_request_error")
                return
            text = fake.answer_for(model, body.get("messages", []))
            calls = fake.calls_for(model, body)
            if body.get("stream") and calls:
                try:
                    self._stream_calls(model, calls)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client hung up, as in _stream
            elif body.get("stream"):
                self._stream(model, text)
            else:
                words = text.split(" ")
                self._json(200, {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                                 "model": model, "choices": [{"index": 0, "finish_reason": "stop",
                                                              "message": {"role": "assistant", "content": text}}],
                                 "usage": {"prompt_tokens": 5, "completion_tokens": len(words),
                                           "total_tokens": 5 + len(words)}})

        def _stream(self, model: str, text: str) -> None:
            try:
                self._send_stream(model, text)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client hung up (Stop, or its page went away): what a real server sees too

        def _open_stream(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")  # the body ends when the connection closes
            self.end_headers()
            self.close_connection = True

        def _stream_calls(self, model: str, calls: list[dict]) -> None:
            self._open_stream()
            for i, call in enumerate(calls):
                arguments = json.dumps(call["arguments"])
                half = len(arguments) // 2
                self._event({"choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
                    {"index": i, "id": f"call_fake_{i}", "type": "function",
                     "function": {"name": call["name"], "arguments": ""}}]}}]}, model)
                for part in (arguments[:half], arguments[half:]):
                    self._event({"choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
                        {"index": i, "function": {"arguments": part}}]}}]}, model)
            self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
                         "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}}, model)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def _send_stream(self, model: str, text: str) -> None:
            self._open_stream()
            words = text.split(" ")
            pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
            die_after = fake.die_after.get(model)
            for i, piece in enumerate(pieces):
                if die_after is not None and i >= die_after:
                    return  # the connection closes with no [DONE]: the server died mid-answer
                if fake.gate is not None and i >= fake.gate_after:
                    fake.gate.wait()
                self._event({"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}, model)
            self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 5, "completion_tokens": len(pieces),
                                   "total_tokens": 5 + len(pieces)}}, model)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def _event(self, chunk: dict[str, Any], model: str) -> None:
            payload = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()),
                       "model": model, **chunk}
            self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            self.wfile.flush()

    return Handler


# ====================================================================== the orchestrator's serve side, faked
FAKE_JOB_ID = "20260101-000000-fa4e00"


class FakeServeJob:
    """Plays the serve job behind the Playground: replaces the orchestrator's serve methods (``start_server``,
    ``find_server``, ``server_key``, ``endpoint``) and ``stop``, and answers ``Orchestrator.get_run`` for its
    job id (every other id goes to the real store). This is the seam the Playground tests use: the page talks
    to ``FakeOpenAI`` over real HTTP, with the key ``start_server`` returned, exactly as it talks to a real
    serve job's endpoint.

    ``status``/``ready``/``error``/``log_tail`` set what the page sees: queued, loading (running, not
    ready), ready, or failed with an error and a log tail. ``served`` maps a source key to the model name."""

    def __init__(self, url: str, api_key: str, served: dict[str, str]):
        self.url, self.api_key, self.served = url, api_key, dict(served)
        self.start_status = RunStatus.RUNNING  # what a started job is: RUNNING, or QUEUED behind a run
        self.status = RunStatus.RUNNING
        self.ready = True
        self.error = ""
        self.log_tail = ""
        self.started: list[list[str]] = []  # source keys of every start_server call
        self.stops = 0  # Stop requests for the job
        self._sources: list[str] = []

    def start_server(self, orch: Any, sources: list, actor: Any = None, purpose: str = "playground") -> tuple[str, str]:
        self.status = self.start_status
        self._sources = [s.key for s in sources]
        self.started.append(list(self._sources))
        return FAKE_JOB_ID, self.api_key

    def endpoint(self, orch: Any, job_id: str) -> Endpoint | None:
        if job_id != FAKE_JOB_ID or not self.ready or self.status is not RunStatus.RUNNING:
            return None
        return Endpoint(self.url, tuple(ServedModel(self.served[k], k, k) for k in self._sources if k in self.served),
                        engine="fake", pid=0)

    def find_server(self, orch: Any, sources: list, actor: Any = None) -> str | None:
        """The running fake job when it serves exactly ``sources`` (the page then reuses it)."""
        same = sorted(s.key for s in sources) == sorted(self._sources)
        return FAKE_JOB_ID if same and self.started and not self.status.is_terminal() else None

    def server_key(self, orch: Any, job_id: str) -> str | None:
        return self.api_key if job_id == FAKE_JOB_ID and not self.status.is_terminal() else None

    def stop(self, orch: Any, run_id: str, actor: Any = None) -> None:
        assert run_id == FAKE_JOB_ID, run_id
        self.stops += 1
        self.status = RunStatus.STOPPED

    def row(self) -> RunRecord:
        return RunRecord(id=FAKE_JOB_ID, name="playground server", kind=JobKind.SERVE, status=self.status,
                         error=self.error, log_tail=self.log_tail, phase="" if self.ready else "loading models")

    def install(self, setattr_: Callable[[Any, str, Any], None]) -> None:
        """Patch the Orchestrator class through ``setattr_`` (pytest's ``monkeypatch.setattr`` with
        raising=False, or plain ``setattr`` in a server process started only for a test)."""
        real_get_run = Orchestrator.get_run
        job = self

        def get_run(orch: Any, run_id: str) -> RunRecord | None:
            return job.row() if run_id == FAKE_JOB_ID else real_get_run(orch, run_id)

        setattr_(Orchestrator, "start_server",
                 lambda orch, sources, actor=None, purpose="playground": job.start_server(orch, sources, actor, purpose))
        setattr_(Orchestrator, "endpoint", lambda orch, job_id: job.endpoint(orch, job_id))
        setattr_(Orchestrator, "find_server", lambda orch, sources, actor=None: job.find_server(orch, sources, actor))
        setattr_(Orchestrator, "server_key", lambda orch, job_id: job.server_key(orch, job_id))
        setattr_(Orchestrator, "get_run", get_run)
        setattr_(Orchestrator, "stop", lambda orch, run_id, actor=None: job.stop(orch, run_id, actor))
