"""The dashboard's and the CLI's client of a model server's OpenAI-compatible API (httpx only, no torch).

A serve job runs an existing server (``transformers serve``, or vLLM on a GPU host) behind our
middleware; this module talks to it over HTTP like any OpenAI client would:

    stream = stream_chat(url, key, "smollm2-demo", messages, Sampling(max_new_tokens=64))
    for piece in stream:          # text pieces as they arrive (SSE ``data:`` lines)
        print(piece, end="")
    stream.stats                  # AnswerStats, set once the stream is exhausted (None before)

``stream_chat`` returns a ``ChatStream``: an iterator of text pieces that also carries ``.stats`` and
``.text``, and ``.tool_calls`` when the request offered ``tools`` and the model called some (OpenAI's streamed
``delta.tool_calls`` put together by index: id, name, and the arguments' JSON text). Reading happens on a small background thread so that a ``cancel`` event stops the iteration
within ``POLL_S`` even while the server is still loading the model or computing the first token; the
connection is then closed, which makes the server abort the generation.

Every failure is a ``ServeError`` with a message that says what happened and what to do (server not
running, wrong key, unknown model, prompt too long, server died mid-answer, timeout).

Kept whole: the one client of a model server's OpenAI-compatible API (models, health, chat streaming,
transcriptions), whose failures all map to one ServeError vocabulary.
"""
from __future__ import annotations

import json
import math
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

from trainer_core.config import FieldError

POLL_S = 0.05  # how often a waiting reader looks at ``cancel``: the longest a Stop button waits
MAX_NEW_TOKENS = 32_768
SEED_MAX = 2**32 - 1  # torch.manual_seed and vLLM both take a 32-bit seed safely
ERROR_TEXT_MAX = 500  # a server's error body is quoted up to this many characters


# ====================================================================== sampling
@dataclass
class Sampling:
    """Sampling settings of one answer. ``temperature`` 0 means greedy (then top_p/top_k/min_p do nothing);
    ``top_k`` 0 and ``min_p`` 0 mean off; ``seed`` None means a fresh random seed per answer."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = 0

    def validate(self) -> list[FieldError]:
        """Every problem at once, naming the field and the accepted range."""
        errors: list[FieldError] = []

        def number(name: str, low: float, high: float, low_open: bool = False) -> None:
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            ok = ok and (low < value if low_open else low <= value) and value <= high
            if not ok:
                bound = f"greater than {low:g}" if low_open else f"at least {low:g}"
                errors.append(FieldError(name, f"a number {bound} and at most {high:g}, not {value!r}"))

        def integer(name: str, low: int, high: int, allow_none: bool = False) -> None:
            value = getattr(self, name)
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                extra = " (or empty for a random seed)" if allow_none else ""
                errors.append(FieldError(name, f"a whole number from {low} to {high:,}{extra}, not {value!r}"))

        number("temperature", 0.0, 2.0)
        number("top_p", 0.0, 1.0, low_open=True)
        integer("top_k", 0, 100_000)
        number("min_p", 0.0, 1.0)
        number("repetition_penalty", 0.0, 10.0, low_open=True)
        integer("max_new_tokens", 1, MAX_NEW_TOKENS)
        integer("seed", 0, SEED_MAX, allow_none=True)
        return errors

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_body(self) -> dict:
        """The request fields: OpenAI's, plus top_k/min_p/repetition_penalty as top-level extra fields (the
        way vLLM takes them; the serve job's middleware translates them for transformers serve)."""
        body = {
            "temperature": float(self.temperature),
            "top_p": float(self.top_p),
            "max_tokens": int(self.max_new_tokens),
            "top_k": int(self.top_k),
            "min_p": float(self.min_p),
            "repetition_penalty": float(self.repetition_penalty),
        }
        if self.seed is not None:
            body["seed"] = int(self.seed)
        return body


@dataclass
class AnswerStats:
    """How one answer went. ``tokens`` comes from the server's usage report when it sends one, else it is
    the number of streamed text pieces. ``ttft_s``: request sent to first text piece (None when nothing
    came). ``tokens_per_s``: the decode rate after the first token, (tokens - 1) / (total_s - ttft_s),
    None with fewer than two tokens. ``finish_reason``: "stop", "length", or None when cancelled."""

    tokens: int
    ttft_s: float | None
    total_s: float
    tokens_per_s: float | None
    finish_reason: str | None


class ServeError(RuntimeError):
    """A model server request that failed; the message says what happened and the fix.
    ``status`` is the HTTP status when the server answered with one."""

    def __init__(self, message: str, status: int | None = None):
        self.status = status
        super().__init__(message)


# ====================================================================== helpers
def _root(base_url: str) -> str:
    """``http://host:port`` from ``http://host:port/v1``."""
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _server_message(response: httpx.Response) -> str:
    """The error text of an OpenAI-style ({"error": {"message"}}), FastAPI ({"detail"}) or plain body."""
    try:
        data = response.json()
    except ValueError:
        return response.text.strip()[:ERROR_TEXT_MAX]
    if isinstance(data, dict):
        error = data.get("error", data.get("detail"))
        if isinstance(error, dict):
            error = error.get("message", error)
        if error is not None:
            return (error if isinstance(error, str) else json.dumps(error))[:ERROR_TEXT_MAX]
    return json.dumps(data)[:ERROR_TEXT_MAX]


def _status_error(response: httpx.Response, base_url: str, model: str = "") -> ServeError:
    status, detail = response.status_code, _server_message(response)
    if status == 401:
        return ServeError(f"the model server at {base_url} refused the API key (401): use the key printed when the "
                          "server started, or start a new server for a new key", status)
    if status == 404 and model:
        return ServeError(f"the model server at {base_url} does not serve {model!r} (404): {detail}", status)
    if status == 404:
        return ServeError(f"{base_url} has no such endpoint (404): is this URL a model server? {detail}", status)
    if status in (400, 413, 422):
        return ServeError(f"the model server refused the request ({status}): {detail}", status)
    if status == 503:
        return ServeError(f"the model server at {base_url} is not ready (503): {detail}; wait a moment and retry",
                          status)
    return ServeError(f"the model server at {base_url} failed ({status}): {detail or 'no details'}; "
                      "its job log says why", status)


def _transport_error(exc: httpx.HTTPError, base_url: str, timeout_s: float, started: bool) -> ServeError:
    if isinstance(exc, httpx.ConnectError):
        return ServeError(f"no model server is running at {base_url} (connection refused): start it again")
    if isinstance(exc, httpx.TimeoutException):
        what = "the next piece of the answer" if started else "the start of an answer"
        return ServeError(f"the model server at {base_url} did not send {what} within {timeout_s:g} s: it may be "
                          "overloaded or stuck; look at its job log, or stop it and start again")
    if started:
        return ServeError(f"the model server at {base_url} stopped mid-answer ({type(exc).__name__}): "
                          "it was stopped or crashed; its job log says why")
    return ServeError(f"the model server at {base_url} closed the connection ({type(exc).__name__}: {exc}): "
                      "it was stopped or crashed; its job log says why")


def _timeout(timeout_s: float) -> httpx.Timeout:
    return httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))


# ====================================================================== small calls
def list_models(base_url: str, api_key: str, timeout_s: float = 10.0) -> list[str]:
    """The model names the server answers to (ServeError when it cannot be asked)."""
    try:
        response = httpx.get(f"{base_url.rstrip('/')}/models", headers=_headers(api_key), timeout=_timeout(timeout_s))
    except httpx.HTTPError as exc:
        raise _transport_error(exc, base_url, timeout_s, started=False) from None
    if response.status_code != 200:
        raise _status_error(response, base_url)
    try:
        return [str(item["id"]) for item in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise ServeError(f"{base_url}/models did not answer with an OpenAI model list: is this a model "
                         "server?") from None


def health(base_url: str, api_key: str, timeout_s: float = 5.0) -> bool:
    """True when the server answers its health check with 200 (False when down, refusing or unhealthy)."""
    try:
        response = httpx.get(f"{_root(base_url)}/health", headers=_headers(api_key), timeout=_timeout(timeout_s))
    except httpx.HTTPError:
        return False
    return response.status_code == 200


@dataclass(frozen=True)
class Transcript:
    text: str
    seconds: float  # wall time of the request


def transcribe(base_url: str, api_key: str, model: str, clip: bytes, filename: str = "clip.wav",
               timeout_s: float = 300.0) -> Transcript:
    """``model``'s transcript of one audio clip (POST /v1/audio/transcriptions, a multipart form as OpenAI's API
    takes it). ServeError names what failed and the fix."""
    started = time.monotonic()
    try:
        response = httpx.post(f"{base_url.rstrip('/')}/audio/transcriptions", headers=_headers(api_key),
                              data={"model": model}, files={"file": (filename, clip, "application/octet-stream")},
                              timeout=_timeout(timeout_s))
    except httpx.HTTPError as exc:
        raise _transport_error(exc, base_url, timeout_s, started=False) from None
    if response.status_code != 200:
        raise _status_error(response, base_url, model)
    try:
        text = response.json()["text"]
    except (ValueError, KeyError, TypeError):
        raise ServeError(f"{base_url}/audio/transcriptions did not answer with a transcription") from None
    if not isinstance(text, str):
        raise ServeError(f"{base_url}/audio/transcriptions answered without a text transcript")
    return Transcript(text.strip(), time.monotonic() - started)


# ====================================================================== streaming chat
_DONE = object()


class ChatStream:
    """An answer being streamed: iterate for text pieces; ``stats`` is set when the iteration ends
    (finished, or cancelled: then ``finish_reason`` is None). ``text`` holds every piece so far.
    Errors surface from the iteration as ``ServeError``. ``close()`` abandons the answer."""

    def __init__(self, base_url: str, api_key: str, model: str, body: dict, timeout_s: float,
                 cancel: threading.Event | None):
        self.base_url, self.model, self.timeout_s = base_url, model, timeout_s
        self.stats: AnswerStats | None = None
        self.text = ""
        self._cancel = cancel or threading.Event()
        self._closed = threading.Event()
        self._items: queue.Queue = queue.Queue()
        self._pieces = 0
        self._usage_tokens: int | None = None
        self._finish_reason: str | None = None
        self._first_at: float | None = None
        self._calls: dict[int, dict] = {}  # streamed tool calls by index (written by the reader thread)
        self._started = time.perf_counter()
        self._ended = False
        self._thread = threading.Thread(target=self._read, args=(api_key, body), daemon=True,
                                        name=f"chat-stream-{model[:40]}")
        self._thread.start()

    # ---- the consumer side
    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        while not self._ended:
            if self._cancel.is_set():
                self._finish(cancelled=True)
                break
            try:
                item = self._items.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if item is _DONE:
                self._finish(cancelled=False)
                break
            if isinstance(item, ServeError):
                self._finish(cancelled=True)
                raise item
            if self._first_at is None:
                self._first_at = time.perf_counter()
            self._pieces += 1
            self.text += item
            return item
        raise StopIteration

    def close(self) -> None:
        if not self._ended:
            self._finish(cancelled=True)

    @property
    def tool_calls(self) -> list[dict]:
        """The calls the model made, in OpenAI's form: ``{"id", "type": "function", "function": {"name",
        "arguments"}}`` (arguments as the JSON text the server sent); complete once the iteration has ended."""
        return [{"id": call["id"], "type": "function",
                 "function": {"name": call["name"], "arguments": call["arguments"]}}
                for _, call in sorted(self._calls.items())]

    def _finish(self, cancelled: bool) -> None:
        self._ended = True
        self._closed.set()  # the reader drops the connection at its next chunk (the server then stops generating)
        total = time.perf_counter() - self._started
        tokens = self._usage_tokens if self._usage_tokens is not None and not cancelled else self._pieces
        ttft = None if self._first_at is None else self._first_at - self._started
        rate = None
        if ttft is not None and tokens >= 2 and total > ttft:
            rate = (tokens - 1) / (total - ttft)
        self.stats = AnswerStats(tokens=tokens, ttft_s=ttft, total_s=total, tokens_per_s=rate,
                                 finish_reason=None if cancelled else self._finish_reason)

    # ---- the reader thread: puts str pieces, then _DONE or a ServeError
    def _read(self, api_key: str, body: dict) -> None:
        try:
            with httpx.Client(timeout=_timeout(self.timeout_s)) as client:
                with client.stream("POST", f"{self.base_url.rstrip('/')}/chat/completions", json=body,
                                   headers=_headers(api_key)) as response:
                    if response.status_code != 200:
                        response.read()
                        self._items.put(_status_error(response, self.base_url, self.model))
                        return
                    self._read_events(response)
        except httpx.HTTPError as exc:
            if not self._closed.is_set():
                self._items.put(_transport_error(exc, self.base_url, self.timeout_s, started=self._pieces > 0))
        except ServeError as exc:
            self._items.put(exc)
        except Exception as exc:  # noqa: BLE001 - thread boundary: a reader that dies silently hangs the consumer
            self._items.put(ServeError(f"the model server at {self.base_url} sent an answer this client cannot read "
                                       f"({type(exc).__name__}: {str(exc)[:200]}): is this an OpenAI-compatible "
                                       "server?"))

    def _read_events(self, response: httpx.Response) -> None:
        for line in response.iter_lines():
            if self._closed.is_set():
                return
            if not line.startswith("data:"):
                continue  # comments, event names, blank separators
            data = line[5:].strip()
            if data == "[DONE]":
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                raise ServeError(f"the model server sent a malformed event: {data[:200]!r}") from None
            self._take(chunk)
        if not self._closed.is_set():
            if self._finish_reason is None:
                raise ServeError(f"the model server at {self.base_url} stopped mid-answer (the stream ended "
                                 "without a finish reason): it was stopped or crashed; its job log says why")
            self._items.put(_DONE)

    def _take(self, chunk: dict) -> None:
        if not isinstance(chunk, dict):
            raise ServeError(f"the model server sent a malformed event: {str(chunk)[:200]!r}")
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message", error) if isinstance(error, dict) else error
            raise ServeError(f"the model server failed mid-answer: {str(message)[:ERROR_TEXT_MAX]}")
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self._usage_tokens = usage["completion_tokens"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            piece = delta.get("content")
            if isinstance(piece, str) and piece:
                self._items.put(piece)
            for call in delta.get("tool_calls") or []:
                self._take_call(call)
            if choice.get("finish_reason"):
                self._finish_reason = str(choice["finish_reason"])


    def _take_call(self, call) -> None:
        """One ``delta.tool_calls`` item: the first piece of a call brings its id and name, later ones more of its
        arguments' text."""
        if not isinstance(call, dict):
            raise ServeError(f"the model server sent a malformed tool call: {str(call)[:200]!r}")
        index = call.get("index") if isinstance(call.get("index"), int) else len(self._calls)
        entry = self._calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        if isinstance(call.get("id"), str) and call["id"]:
            entry["id"] = call["id"]
        if isinstance(function.get("name"), str) and function["name"]:
            entry["name"] = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            entry["arguments"] += arguments
        elif isinstance(arguments, dict):  # a server that sends the object itself
            entry["arguments"] += json.dumps(arguments)


def chat_body(model: str, messages: list[dict], sampling: Sampling, tools: list[dict] | None = None) -> dict:
    """The streaming chat request: messages, sampling fields, a request for the usage report, and the tools the
    model may call (when given)."""
    return {"model": model, "messages": messages, "stream": True,
            "stream_options": {"include_usage": True}, **sampling.to_body(), **({"tools": tools} if tools else {})}


def stream_chat(base_url: str, api_key: str, model: str, messages: list[dict], sampling: Sampling, *,
                timeout_s: float = 30.0, cancel: threading.Event | None = None,
                tools: list[dict] | None = None) -> ChatStream:
    """Start streaming the answer of ``model`` to ``messages``; see ``ChatStream``. ``timeout_s`` bounds
    the wait for the connection and for each next piece (not the whole answer). Invalid sampling settings
    raise ServeError naming the fields, before anything is sent."""
    problems = sampling.validate()
    if problems:
        raise ServeError("; ".join(map(str, problems)))
    return ChatStream(base_url, api_key, model, chat_body(model, messages, sampling, tools), timeout_s, cancel)
