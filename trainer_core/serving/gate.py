"""The key gate: a small ASGI middleware in front of the serving engine's own OpenAI-compatible app.

Neither ``transformers serve`` nor a bare app checks an API key, and both expose routes a teammate must
not reach (``/load_model`` loads any hub model, ``/reset`` unloads everything). The gate:

* requires ``Authorization: Bearer <key>`` on every request (sha256 compared with hmac.compare_digest;
  401 otherwise, /v1/models and /health included);
* lets through only GET /health, POST /v1/chat/completions and POST /v1/completions (models that write
  answers) and POST /v1/audio/transcriptions (speech-to-text models: a multipart form, read whole, its ``model``
  checked, passed on unchanged), and answers GET /v1/models itself with the served names (404 for everything
  else); a request for a model of the other kind is a 400 naming the route it takes;
* reads at most ``max_body_bytes`` of a request body (413 beyond; JSON nested deeper than MAX_JSON_DEPTH is a
  400), refuses a ``model`` that is not served (404 naming the served ones), sampling values out of their
  range (400 naming the field and the range) and, when ``limits`` can count tokens, a prompt longer than the
  context (400); shortens ``max_tokens`` to the operator's cap and to what the context leaves;
* ends a request whose client went away (``http.disconnect``), streaming or not, and one that runs past
  ``request_timeout_s`` (504 when nothing was sent yet), by cancelling the engine's task: the engine stops
  generating (transformers serve: worker/serve_generate.py; vLLM aborts a cancelled request itself);
* for transformers serve, turns top_k/min_p/repetition_penalty into its ``generation_config`` JSON, built
  on the model folder's own generation_config.json (so eos/pad tokens are kept), and drops the fields it
  rejects (``stream_options``: it always sends usage in the last chunk);
* lets a chat request carry images (OpenAI's ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``)
  only for a served vision-language model: only ``data:`` URLs (the server never fetches a URL or opens a path: the
  engine's image loader would do both, an SSRF and a file read), at most ``max_images`` per request, each at most
  ``max_image_bytes`` decoded and ``max_image_pixels`` (read from the image's header by Pillow, without decoding
  it); a text model sent an image is a 400 naming it. A request to a vision model may be up to
  ``vision_max_body_bytes`` (a few base64 images); any other stays under ``max_body_bytes``;
* for a served embedding model (infinity-emb behind the gate), lets through POST /v1/embeddings with text input
  only: a string or a list of at most MAX_EMBEDDING_INPUTS strings, and OpenAI's fields (encoding_format,
  dimensions, user); anything else (infinity's ``modality`` would have it fetch image or audio URLs) is a 400
  naming the field, and the engine gets only the checked fields. A chat request to an embedding model, or an
  embedding request to a model that writes answers, is a 400 naming the route it takes;
* checks a chat request's tools, tool_choice and tool turns and pairs tool results with their calls
  (serving/tool_requests.py; for transformers serve it applies tool_choice itself);
* records activity (requests in flight and the last request's end) for the idle timeout;
* when its serve job keeps completions (opt-in, ``store_completions``): appends each answered chat request and its
  answer, under the engine's completion id, to the job's completions file, and takes POST /v1/feedback (a rating,
  an edit or a preferred answer of a stored completion id, with the same key) into the job's feedback file, which
  the dashboard reads into its votes (trainer_core/feedback/served.py).

Standard library and Pillow only (a dependency of the dashboard, transformers and vLLM alike): it runs in the serve
worker and, for vLLM, inside vLLM's process (``--middleware``, configured through the GATE_ENV file).

Kept whole: the key check and every route's request rules run in one ASGI middleware that is loaded by file path
inside other servers' processes (vLLM's --middleware, infinity's venv), so it cannot import sibling modules; its
parts are the routes' validators, each a few functions.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import email.message
import functools
import hashlib
import hmac
import io
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from PIL import Image, UnidentifiedImageError

GATE_ENV = "FINETUNE_STUDIO_SERVE_GATE"  # a gate.json path, for a gate built by vLLM as KeyGate(app)
MAX_BODY_BYTES = 4 << 20  # a long conversation is well under 1 MB of JSON
TRANSCRIPTIONS = "/v1/audio/transcriptions"
EMBEDDINGS = "/v1/embeddings"
FEEDBACK = "/v1/feedback"  # a rating, edit or preferred answer of a stored completion (issue 34)
ROUTES = {("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
          ("POST", TRANSCRIPTIONS), ("POST", EMBEDDINGS), ("POST", FEEDBACK)}
CAPTURE_BYTES = 8 << 20  # a stored completion's response read at most this far (a streamed one is many small events)
FEEDBACK_TEXT_MAX = 100_000  # characters of an edit or preferred answer (as a vote in the dashboard)
MAX_EMBEDDING_INPUTS = 2048  # texts in one embeddings request, as OpenAI's API takes them
EMBEDDING_FIELDS = ("model", "input", "encoding_format", "dimensions", "user")  # OpenAI's embeddings request
ENCODING_FORMATS = ("float", "base64")
MAX_AUDIO_BYTES = 25 << 20  # one clip, as OpenAI's transcription API takes it (25 MB)
FORM_OVERHEAD_BYTES = 64 << 10  # a transcription form's fields and part headers around the clip
MAX_FORM_PARTS = 12  # fields in a transcription form (OpenAI's API has ten)
MAX_PART_HEADER_BYTES = 4096  # one form part's headers
# OpenAI's transcription fields. The engine gets a form the gate writes: the checked model, the clip and stream;
# the others are accepted and left out (transformers serve ignores them too).
FORM_FIELDS = frozenset({"file", "model", "stream", "language", "prompt", "response_format", "temperature",
                         "timestamp_granularities", "timestamp_granularities[]", "chunking_strategy", "include",
                         "include[]"})
MAX_IMAGES = 8  # images in one chat request (a conversation resends its earlier images)
MAX_IMAGE_BYTES = 10 << 20  # one image, decoded from its base64
MAX_IMAGE_PIXELS = 4096 * 4096  # width x height: a 1000-byte PNG can claim 100,000 x 100,000 px and fill the memory
# A vision model's request: the text limit plus room for a few images at their largest (base64 is 4/3 of the bytes).
VISION_MAX_BODY_BYTES = MAX_BODY_BYTES + 4 * (MAX_IMAGE_BYTES * 4 // 3)
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
# Content parts that carry media; only image_url is taken (and only by a vision model).
MEDIA_PARTS = ("image_url", "input_image", "image", "video_url", "input_audio", "audio_url", "video", "audio")
# transformers serve rejects these OpenAI fields (it always reports usage in the last chunk).
TRANSFORMERS_DROPPED = ("stream_options",)
SAMPLING_EXTRAS = ("top_k", "min_p", "repetition_penalty")
ENGINE_DEFAULT_MAX_TOKENS = 1024  # transformers serve's answer length when a request names none
MAX_JSON_DEPTH = 64  # a chat request nests 4 levels (tools' JSON schemas a few more); 100,000 crashed the parser
# (field, lowest, highest, lowest excluded, whole number): the ranges the chat CLI and Playground use (client.Sampling)
SAMPLING_RANGES = (("temperature", 0.0, 2.0, False, False), ("top_p", 0.0, 1.0, True, False),
                   ("top_k", 0, 100_000, False, True), ("min_p", 0.0, 1.0, False, False),
                   ("repetition_penalty", 0.0, 10.0, True, False))


@dataclass
class GateConfig:
    key_hash: str
    models: dict[str, str]  # served name -> model folder ("" when unknown: no generation_config translation)
    translate_sampling: bool = True  # transformers serve: True; vLLM takes top_k/min_p/... itself
    max_body_bytes: int = MAX_BODY_BYTES
    activity_file: str = ""  # touched on each request (vLLM: the worker reads its mtime)
    max_tokens_cap: int = 0  # the longest answer a request may ask for (0: no cap but the context)
    request_timeout_s: float = 0  # a request still running after this long is ended (0: never)
    speech_models: list[str] = field(default_factory=list)  # served names that transcribe (the others chat)
    max_audio_bytes: int = MAX_AUDIO_BYTES
    vision_models: list[str] = field(default_factory=list)  # served names that take image parts
    embedding_models: list[str] = field(default_factory=list)  # served names that embed text (/v1/embeddings)
    vision_max_body_bytes: int = VISION_MAX_BODY_BYTES
    max_images: int = MAX_IMAGES
    max_image_bytes: int = MAX_IMAGE_BYTES
    max_image_pixels: int = MAX_IMAGE_PIXELS
    # Opt-in per serve job (``store_completions``, like OpenAI's ``store: true``): each chat completion is appended to
    # completions_file, and POST /v1/feedback appends a rating of one of them to feedback_file ("": neither).
    completions_file: str = ""
    feedback_file: str = ""

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_file(cls, path: str | Path) -> "GateConfig":
        return cls(**json.loads(Path(path).read_text()))


@dataclass
class Activity:
    """Requests in flight and when the last one ended, for the idle timeout (thread-safe)."""

    in_flight: int = 0
    last: float = field(default_factory=time.monotonic)
    touch_file: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def begin(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.last = time.monotonic()
        self._touch()

    def end(self) -> None:
        with self._lock:
            self.in_flight = max(0, self.in_flight - 1)
            self.last = time.monotonic()
        self._touch()

    def idle_s(self) -> float:
        """Seconds without a request in flight (0 while one is)."""
        with self._lock:
            return 0.0 if self.in_flight else time.monotonic() - self.last

    def _touch(self) -> None:
        if self.touch_file:
            try:
                Path(self.touch_file).touch()
            except OSError:
                pass  # the job folder went away: the worker is ending anyway


class RequestRefused(Exception):
    def __init__(self, status: int, message: str, code: str = "invalid_request_error"):
        self.status, self.message, self.code = status, message, code
        super().__init__(message)


# (model name, request body) -> (prompt tokens, context length), or None when the count is unknown
Limits = Callable[[str, dict], "tuple[int, int] | None"]


@functools.lru_cache(maxsize=64)
def _model_generation_config(folder: str) -> dict[str, Any]:
    """A served folder's generation_config.json (read once: it is on every request's path)."""
    if not folder:
        return {}
    try:
        data = json.loads((Path(folder) / "generation_config.json").read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if not k.startswith("_") and k != "transformers_version"}


def generation_config_json(folder: str, body: dict) -> str:
    """transformers serve's ``generation_config`` for ``body``: the folder's generation_config.json (eos,
    pad, bos kept) with the request's sampling fields on top; temperature 0 means greedy."""
    base = dict(_model_generation_config(folder))
    temperature = body.get("temperature")
    temperature = 1.0 if temperature is None else float(temperature)
    base["do_sample"] = temperature > 0
    if temperature > 0:
        base["temperature"] = temperature
        base["top_p"] = float(body["top_p"]) if body.get("top_p") is not None else 1.0
        base["top_k"] = int(body["top_k"]) if body.get("top_k") is not None else 0
        base["min_p"] = float(body["min_p"]) if body.get("min_p") else None
    else:  # greedy: sampling fields would only earn a warning from generate()
        for name in ("temperature", "top_p", "top_k", "min_p"):
            base.pop(name, None)
    if body.get("repetition_penalty") is not None:
        base["repetition_penalty"] = float(body["repetition_penalty"])
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        base["max_new_tokens"] = int(max_tokens)
    return json.dumps({k: v for k, v in base.items() if v is not None})


class KeyGate:
    """ASGI middleware: ``KeyGate(app, config, activity, limits)``; with only ``app`` (vLLM's
    ``--middleware``), the config comes from the file named by GATE_ENV."""

    def __init__(self, app, config: GateConfig | None = None, activity: Activity | None = None,
                 limits: Limits | None = None):
        self.app = app
        self.config = config or GateConfig.from_file(os.environ[GATE_ENV])
        self.activity = activity or Activity(touch_file=self.config.activity_file)
        self.limits = limits

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)  # lifespan: the engine's own startup and shutdown
            return
        try:
            self._check_key(scope)  # only a caller with the key keeps the server from its idle timeout
        except RequestRefused as exc:
            await _refuse(send, exc)
            return
        self.activity.begin()
        try:
            await self._handle(scope, receive, send)
        finally:
            self.activity.end()

    async def _handle(self, scope, receive, send) -> None:
        method, path = scope["method"], scope["path"].rstrip("/") or "/"
        stored = None  # a chat request whose completion is kept (completions_file)
        try:
            if (method, path) not in ROUTES:
                raise RequestRefused(404, f"{method} {path} is not served here; this endpoint serves "
                                          "GET /v1/models, POST /v1/chat/completions, POST /v1/completions, "
                                          f"POST {TRANSCRIPTIONS}, POST {EMBEDDINGS}", "not_found")
            if path == FEEDBACK:
                body, _ = await self._read_body(scope, receive)
                await _json(send, 200, await asyncio.to_thread(self._record_feedback, body))
                return
            if path == "/v1/models":
                await _json(send, 200, {"object": "list", "data": [
                    {"id": name, "object": "model", "created": 0, "owned_by": "finetune-studio"}
                    for name in self.config.models]})
                return
            if path == TRANSCRIPTIONS:
                raw = await self._read_bytes(scope, receive, self.config.max_audio_bytes + FORM_OVERHEAD_BYTES)
                # the engine gets the form the gate wrote from what it checked, never the client's bytes (a
                # second 'model' the engine's parser would prefer, a transfer encoding it reads otherwise)
                raw, content_type = await asyncio.to_thread(self._check_transcription, scope, raw)
                scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                         + [(b"content-type", content_type.encode("latin-1"))]}
            elif method == "POST":
                body, size = await self._read_body(scope, receive)
                self._check_size(body, size)
                if self.config.completions_file and path == "/v1/chat/completions":
                    stored = json.loads(json.dumps(body))  # as the client sent it (the rewrite below edits body)
                raw = json.dumps(self._rewrite(body, path)).encode()
            if method == "POST":
                headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-length", b"transfer-encoding")]
                scope = {**scope, "headers": headers + [(b"content-length", str(len(raw)).encode())]}
        except RequestRefused as exc:
            await _refuse(send, exc)
            return
        if method != "POST":
            await self.app(scope, receive, send)  # GET /health: nothing to generate, nothing to end early
            return
        await self._supervise(scope, raw, receive, send, stored)

    async def _supervise(self, scope, raw: bytes, receive, send, stored: dict | None = None) -> None:
        """Run the engine on one request until it answers, the client disconnects or the request timeout
        passes; in the last two cases the engine's task is cancelled, which is how both engines stop
        generating (a non-streaming answer included: nothing else tells the engine the client is gone)."""
        gone = asyncio.Event()
        started = finished = False
        response, status = bytearray(), 0

        async def watch() -> None:  # the only reader of the connection once the body is in
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        async def engine_receive() -> dict:  # after the replayed body, the engine hears of the disconnect
            await gone.wait()
            return {"type": "http.disconnect"}

        async def tracked_send(message: dict) -> None:
            nonlocal started, finished, status
            started = True
            finished = message["type"] == "http.response.body" and not message.get("more_body", False)
            status = message.get("status", status)
            if stored is not None and message["type"] == "http.response.body" and len(response) < CAPTURE_BYTES:
                response.extend(message.get("body", b""))
            await send(message)
            if stored is not None and finished and status == 200:
                await asyncio.to_thread(self._store_completion, stored, bytes(response))

        engine = asyncio.ensure_future(self.app(scope, _replay(raw, engine_receive), tracked_send))
        watcher = asyncio.ensure_future(watch())
        try:
            timeout = self.config.request_timeout_s or None
            done, _ = await asyncio.wait({engine, watcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if engine in done:
                engine.result()  # the engine's own exception, if any, is the server's to report
                return
            engine.cancel()
            await asyncio.gather(engine, return_exceptions=True)
            if watcher in done or finished:
                return  # nobody is listening, or the answer was complete: nothing more to send
            message = (f"the request ran past this server's request timeout of {timeout:g} s and was ended: ask "
                       "for a shorter answer (max_tokens), or ask whoever started the server for a longer timeout")
            if not started:
                await _refuse(send, RequestRefused(504, message, "timeout"))
            else:  # a streamed answer: one last event saying why it stops, then the end of the body
                event = json.dumps({"error": {"message": message, "type": "timeout", "code": 504}})
                await send({"type": "http.response.body", "body": f"data: {event}\n\n".encode(), "more_body": False})
        finally:
            for task in (engine, watcher):
                task.cancel()
            await asyncio.gather(engine, watcher, return_exceptions=True)

    def _store_completion(self, request: dict, response: bytes) -> None:
        """Append one answered chat request to completions_file: its id (the engine's, which the client got), the
        request's messages, model and sampling, and the answer (a streamed one joined from its deltas)."""
        found = completion_of(response)
        if found is None:
            return
        completion_id, answer = found
        sampling = {k: request[k] for k in ("temperature", "top_p", "max_tokens", "seed", *SAMPLING_EXTRAS)
                    if k in request}
        _append(self.config.completions_file, {"id": completion_id, "created": time.time(),
                                               "model": request.get("model"), "messages": request.get("messages"),
                                               "answer": answer, "sampling": sampling})

    def _record_feedback(self, body: dict) -> dict:
        """A rating (up/down), an edit or a preferred answer of a completion this endpoint stored."""
        if not self.config.completions_file:
            raise RequestRefused(404, "this endpoint does not keep its completions (its serve job was started "
                                      "without store_completions), so none can be rated", "not_found")
        completion_id = body.get("completion_id")
        if not isinstance(completion_id, str) or not completion_id:
            raise RequestRefused(400, "completion_id: the id of a chat completion this endpoint returned")
        if not _has_completion(self.config.completions_file, completion_id):
            raise RequestRefused(404, f"no completion {completion_id[:80]!r} was stored by this endpoint: rate the id "
                                      "of a chat completion it returned (each serve job keeps its own)", "not_found")
        given = {k: body[k] for k in ("rating", "edited", "preferred") if body.get(k) is not None}
        if len(given) != 1:
            raise RequestRefused(400, "give exactly one of rating (\"up\" or \"down\"), edited (your better answer) "
                                      "or preferred (an answer you prefer)")
        (kind, value), = given.items()
        if kind == "rating" and value not in ("up", "down"):
            raise RequestRefused(400, f"rating is \"up\" or \"down\", not {str(value)[:20]!r}")
        if kind != "rating" and (not isinstance(value, str) or not value.strip() or len(value) > FEEDBACK_TEXT_MAX):
            raise RequestRefused(400, f"{kind} is a non-empty text of at most {FEEDBACK_TEXT_MAX:,} characters")
        user = body.get("user") if isinstance(body.get("user"), str) else ""
        record = {"id": f"fb-{os.urandom(8).hex()}", "completion_id": completion_id, kind: value, "user": user[:200],
                  "created": time.time()}
        _append(self.config.feedback_file, record)
        return {"id": record["id"], "object": "feedback", "completion_id": completion_id}

    def _check_key(self, scope) -> None:
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, key = header.partition(" ")
        digest = hashlib.sha256(key.strip().encode("latin-1")).hexdigest()
        if scheme.lower() != "bearer" or not key.strip() or not hmac.compare_digest(digest, self.config.key_hash):
            raise RequestRefused(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>' "
                                      "with the key printed when the server started", "invalid_api_key")

    async def _read_bytes(self, scope, receive, cap: int) -> bytes:
        """The whole request body, at most ``cap`` bytes (413 beyond, from the declared length when there is one)."""
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise RequestRefused(413, f"the request body is {int(declared):,} bytes; at most {cap:,} are accepted")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RequestRefused(400, "the client disconnected before sending the whole request")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > cap:
                raise RequestRefused(413, f"the request body is over {cap:,} bytes, the most accepted")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    def _body_cap(self) -> int:
        """The most a JSON request may hold before its model is known: more when a vision model is served."""
        if self.config.vision_models:
            return max(self.config.max_body_bytes, self.config.vision_max_body_bytes)
        return self.config.max_body_bytes

    def _check_size(self, body: dict, size: int) -> None:
        """Only a request to a vision model may use the room kept for images."""
        cap = self.config.max_body_bytes
        if size > cap and body.get("model") not in self.config.vision_models:
            raise RequestRefused(413, f"the request body is {size:,} bytes; at most {cap:,} are accepted for "
                                      f"{str(body.get('model'))[:80]!r} (more only for a vision model's images)")

    async def _read_body(self, scope, receive) -> tuple[dict, int]:
        raw = await self._read_bytes(scope, receive, self._body_cap())
        try:
            body = json.loads(raw, parse_constant=_not_json)
        except (ValueError, UnicodeDecodeError):
            raise RequestRefused(400, "the request body is not JSON (NaN and Infinity are not JSON numbers)") from None
        except RecursionError:
            raise RequestRefused(400, f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from None
        if not isinstance(body, dict):
            raise RequestRefused(400, "the request body must be a JSON object")
        if json_depth(body) > MAX_JSON_DEPTH:
            raise RequestRefused(400, f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
        return body, len(raw)

    def _check_transcription(self, scope, raw: bytes) -> tuple[bytes, str]:
        """A transcription request: a multipart form with a ``file`` (an audio clip) and the ``model``, a served
        speech model; returns the form the engine gets (model, file, stream) and its content type."""
        types = [v for k, v in scope["headers"] if k == b"content-type"]
        if len(types) != 1:
            raise RequestRefused(400, "a transcription request has one Content-Type header: multipart/form-data")
        fields = multipart_fields(types[0].decode("latin-1"), raw)
        if fields is None:
            raise RequestRefused(400, "a transcription request is a multipart/form-data form with the fields 'file' "
                                      "(the audio clip) and 'model'")
        unknown = sorted(set(fields) - FORM_FIELDS)
        if unknown:
            raise RequestRefused(400, f"unknown form field(s) {', '.join(map(repr, unknown))[:200]}: a transcription "
                                      "form has 'file', 'model' and OpenAI's optional fields")
        model = fields.get("model")
        self._served(model)
        if model in self.config.embedding_models:
            raise RequestRefused(400, f"model {model!r} turns text into vectors and does not transcribe audio: POST "
                                      f"text to {EMBEDDINGS}")
        if model not in self.config.speech_models:
            raise RequestRefused(400, f"model {model!r} writes text and does not transcribe audio: send it chat "
                                      "requests (POST /v1/chat/completions)")
        clip = fields.get("file")
        if not isinstance(clip, bytes) or not clip:
            raise RequestRefused(400, "the form has no 'file' field with the audio clip (WAV, FLAC, OGG or MP3) sent "
                                      "as a file")
        if len(clip) > self.config.max_audio_bytes:
            raise RequestRefused(413, f"the clip is {len(clip):,} bytes; at most {self.config.max_audio_bytes:,} are "
                                      "accepted: send a shorter clip")
        if not looks_like_audio(clip):
            raise RequestRefused(400, "the 'file' is not an audio clip this server decodes: send WAV, FLAC, OGG or "
                                      "MP3 (or AIFF, AU)")
        stream = fields.get("stream")
        if stream is not None and stream not in ("true", "false"):
            raise RequestRefused(400, f"stream must be true or false, not {str(stream)[:20]!r}")
        return encode_form({"model": model, **({"stream": stream} if stream else {})}, clip)

    def _served(self, model: Any) -> None:
        if not isinstance(model, str) or model not in self.config.models:
            shown = repr(model)[:80] if model is not None else "no model"
            raise RequestRefused(404, f"model {shown} is not served here; served: {', '.join(self.config.models)}",
                                 "model_not_found")

    def _rewrite(self, body: dict, path: str = "/v1/chat/completions") -> dict:
        model = body.get("model")
        self._served(model)
        if path == EMBEDDINGS or model in self.config.embedding_models:
            return self._embedding_body(body, model, path)
        if model in self.config.speech_models:
            raise RequestRefused(400, f"model {model!r} transcribes audio and does not write answers: POST the clip "
                                      f"to {TRANSCRIPTIONS} (a multipart form with 'file' and 'model')")
        shape_problem(path, body, self.config.translate_sampling)
        if path == "/v1/chat/completions" and carries_tools(body):
            body = tools_shaped(body, self.config.translate_sampling)
        image_problem(body, model, self.config)
        sampling_problem(body)
        for name in ("max_tokens", "max_completion_tokens"):  # the engines pass a bad one to generate()
            value = body.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise RequestRefused(400, f"{name} must be a whole number of tokens, at least 1, not {value!r:.40}")
        wanted = body.get("max_completion_tokens", body.get("max_tokens"))
        cap = self.config.max_tokens_cap
        if cap:  # the operator's cap; a request naming none gets the engine's default (vLLM's: the whole context)
            default = ENGINE_DEFAULT_MAX_TOKENS if self.config.translate_sampling else cap
            capped = min(default if wanted is None else wanted, cap)
            if capped != wanted:
                body = {**body, "max_tokens": capped}
                body.pop("max_completion_tokens", None)
        limits = self.limits(model, body) if self.limits else None
        if limits is not None:
            prompt, context = limits
            if prompt >= context:
                raise RequestRefused(400, f"the prompt has {prompt:,} tokens but {model} reads at most {context:,} "
                                          "(its context length): shorten the conversation or the system prompt",
                                     "context_length_exceeded")
            wanted = body.get("max_completion_tokens", body.get("max_tokens"))
            room = context - prompt
            asked = wanted if isinstance(wanted, int) and not isinstance(wanted, bool) else ENGINE_DEFAULT_MAX_TOKENS
            if asked > room:  # the answer may only fill what the context leaves
                body = {**body, "max_tokens": room}
                body.pop("max_completion_tokens", None)
        if not self.config.translate_sampling:
            return body
        body = {k: v for k, v in body.items() if k not in TRANSFORMERS_DROPPED}
        try:
            config = generation_config_json(self.config.models[model], body)
        except (TypeError, ValueError):
            raise RequestRefused(400, "temperature, top_p, top_k, min_p, repetition_penalty and max_tokens "
                                      "must be numbers") from None
        for name in SAMPLING_EXTRAS:
            body.pop(name, None)
        if body.get("temperature") == 0:
            body.pop("temperature")  # greedy is do_sample=False above; a 0 temperature only earns a warning
        body["generation_config"] = config
        return body


    def _embedding_body(self, body: dict, model: str, path: str) -> dict:
        """The embeddings request the engine gets: OpenAI's fields only, each checked (text input only)."""
        if model not in self.config.embedding_models:
            raise RequestRefused(400, f"model {model!r} writes answers and does not embed text: send it chat requests "
                                      "(POST /v1/chat/completions)" + (f"; embedding models served here: "
                                      f"{', '.join(self.config.embedding_models)}" if self.config.embedding_models
                                      else ""))
        if path != EMBEDDINGS:
            raise RequestRefused(400, f"model {model!r} turns text into vectors and does not write answers: POST the "
                                      f"texts to {EMBEDDINGS} (openai client: client.embeddings.create)")
        embedding_problem(body)
        return {name: body[name] for name in EMBEDDING_FIELDS if body.get(name) is not None}


def embedding_problem(body: dict) -> None:
    """RequestRefused (400, naming the field) unless ``body`` is OpenAI's embeddings request with text input."""
    unknown = sorted(set(body) - set(EMBEDDING_FIELDS))
    if unknown:
        raise RequestRefused(400, f"unknown field(s) {', '.join(map(repr, unknown))[:200]}: an embeddings request has "
                                  f"{', '.join(EMBEDDING_FIELDS)} (this server embeds text only)")
    texts = body.get("input")
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise RequestRefused(400, "input must be a non-empty string or a list of non-empty strings (token id lists "
                                  "are not taken here: send the text)")
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise RequestRefused(400, f"input holds {len(texts):,} texts; at most {MAX_EMBEDDING_INPUTS:,} per request: "
                                  "send them in several requests")
    fmt = body.get("encoding_format")
    if fmt is not None and fmt not in ENCODING_FORMATS:
        raise RequestRefused(400, f"encoding_format must be one of {', '.join(ENCODING_FORMATS)}, not {fmt!r:.40}")
    dims = body.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims < 1):
        raise RequestRefused(400, f"dimensions must be a whole number, at least 1, not {dims!r:.40}")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise RequestRefused(400, "user must be a string")


def carries_tools(body: dict) -> bool:
    """Whether a chat request has tool fields or tool turns (only those load the tool rules' module)."""
    if any(name in body for name in ("tools", "tool_choice", "parallel_tool_calls")):
        return True
    return any(isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls")) for m in body["messages"])


def tools_shaped(body: dict, transformers_engine: bool) -> dict:
    """The request with its tools checked and shaped for the engine (serving/tool_requests.py: a sibling module,
    imported here only, since chat requests reach only the chat engines' processes, where the studio is importable)."""
    from trainer_core.serving import tool_requests

    try:
        return tool_requests.shape(body, engine_enforces_choice=not transformers_engine)
    except tool_requests.ToolRequestError as exc:
        raise RequestRefused(400, str(exc)) from None


def shape_problem(path: str, body: dict, transformers_engine: bool) -> None:
    """RequestRefused (400, naming the field) for a request the engine would answer with a bare 500 (messages
    that are not a list of role/content objects) or silently answer otherwise (transformers serve gives one
    answer whatever ``n`` asks for)."""
    if path == "/v1/chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestRefused(400, "messages must be a non-empty list of {\"role\": ..., \"content\": ...} "
                                      "objects")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str) or \
                    not isinstance(message.get("content", ""), (str, list, type(None))):
                raise RequestRefused(400, f"messages[{i}] must be an object with a text role and a text (or list of "
                                          "parts) content")
    if transformers_engine and path == "/v1/completions" and not isinstance(body.get("prompt"), str):
        raise RequestRefused(400, "prompt must be a string")
    n = body.get("n")
    if transformers_engine and n is not None and n != 1:
        raise RequestRefused(400, f"n must be 1 here (one answer per request), not {n!r:.20}: send the request "
                                  "again for another answer")


def image_problem(body: dict, model: str, config: GateConfig) -> None:
    """RequestRefused for media in a chat request that the model cannot take or the server must not load: an image
    for a text model, a part other than ``image_url``, a URL that is not a ``data:`` URL (the engine's loader would
    fetch it, or open it as a local path), too many images, an image too large in bytes or pixels, or one that is
    not a PNG, JPEG, WebP or GIF. Each message names the message and part, and the fix."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    count = 0
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if not isinstance(kind, str):
                raise RequestRefused(400, f"{where} must be an object with a \"type\" (\"text\" or \"image_url\")")
            if kind not in MEDIA_PARTS:
                continue
            if model not in config.vision_models:
                served = ", ".join(config.vision_models)
                raise RequestRefused(400, f"{where} is an image (or other media), but model {model!r} reads text only: "
                                          "send text parts only, or ask a vision-language model" +
                                          (f" (served here: {served})" if served else ""))
            if kind != "image_url":
                raise RequestRefused(400, f"{where} has type {kind!r}: this server takes images as "
                                          "{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,...\"}}")
            count += 1
            if count > config.max_images:
                raise RequestRefused(400, f"the request holds more than {config.max_images} images, the most one "
                                          "request may carry: start a new conversation, or send fewer images")
            image_size_problem(where, part.get("image_url"), config)


def image_size_problem(where: str, image_url: Any, config: GateConfig) -> None:
    """RequestRefused unless ``image_url`` is a base64 ``data:`` URL of a PNG/JPEG/WebP/GIF within the limits."""
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    fix = "send the image's bytes in the request as data:image/png;base64,<base64 of the file>"
    if not isinstance(url, str):
        raise RequestRefused(400, f"{where}.image_url.url must be a data: URL; {fix}")
    if not url[:5].lower() == "data:":
        shown = "an http(s) URL" if url[:8].lower().startswith(("http://", "https:/")) else "not a data: URL"
        raise RequestRefused(400, f"{where}.image_url.url is {shown}: this server never fetches URLs or opens "
                                  f"files; {fix}")
    header, comma, payload = url[5:].partition(",")
    if not comma or not header.lower().endswith(";base64") or not header.lower().startswith("image/"):
        raise RequestRefused(400, f"{where}.image_url.url must be a base64 image data: URL "
                                  f"(data:image/<png|jpeg|webp>;base64,...)")
    if len(payload) * 3 // 4 > config.max_image_bytes + 3:
        raise RequestRefused(413, f"{where}: the image is about {len(payload) * 3 // 4:,} bytes; at most "
                                  f"{config.max_image_bytes:,} are accepted: resize or compress it")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise RequestRefused(400, f"{where}.image_url.url: the data after 'base64,' is not valid base64") from None
    if len(data) > config.max_image_bytes:
        raise RequestRefused(413, f"{where}: the image is {len(data):,} bytes; at most {config.max_image_bytes:,} are "
                                  "accepted: resize or compress it")
    try:  # reads the header only: the pixels are decoded by the engine, once the size is known to be sane
        with Image.open(io.BytesIO(data)) as image:
            fmt, (width, height) = image.format, image.size
    except Image.DecompressionBombError:  # Pillow's own guard: a header claiming billions of pixels
        raise RequestRefused(400, f"{where}: the image claims far more pixels than can be decoded safely; at most "
                                  f"{config.max_image_pixels:,} pixels are accepted: resize it") from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise RequestRefused(400, f"{where}: the data is not an image Pillow can read (PNG, JPEG, WebP or GIF)") from None
    if fmt not in IMAGE_FORMATS:
        raise RequestRefused(400, f"{where}: a {fmt} image; send a PNG, JPEG, WebP or GIF")
    if width * height > config.max_image_pixels:
        raise RequestRefused(400, f"{where}: the image is {width:,} x {height:,} pixels; at most "
                                  f"{config.max_image_pixels:,} pixels are accepted: resize it")


def sampling_problem(body: dict) -> None:
    """RequestRefused (400, naming the field and its range) for a sampling value generate() would crash on
    (top_k -1, repetition_penalty 0) or take without sense (a negative or 1e308 temperature)."""
    for name, low, high, low_open, whole in SAMPLING_RANGES:
        value = body.get(name)
        if value is None:
            continue
        ok = isinstance(value, int if whole else (int, float)) and not isinstance(value, bool)
        ok = ok and (low < value if low_open else low <= value) and value <= high
        if not ok:
            kind = "a whole number" if whole else "a number"
            bound = f"greater than {low:g} and at most {high:g}" if low_open else f"from {low:g} to {high:g}"
            raise RequestRefused(400, f"{name} must be {kind} {bound}, not {value!r:.40}")


BOUNDARY = re.compile(r'boundary=(?:"([^"]{1,70})"|([^\s;"]{1,70}))', re.IGNORECASE)


def multipart_fields(content_type: str, raw: bytes) -> dict[str, Any] | None:
    """The fields of a multipart/form-data body (name -> text, or the bytes of a file part); None when the body is
    not such a form. Bounded work whatever a stranger sends: at most MAX_FORM_PARTS parts, MAX_PART_HEADER_BYTES
    of headers each; a field named twice, a header given twice in a part, a transfer encoding or an RFC 2231 name
    is a 400 (another parser may read them otherwise)."""
    if len(content_type) > 1024 or not content_type.lower().startswith("multipart/form-data"):
        return None
    found = BOUNDARY.search(content_type)
    if found is None:
        return None
    delimiter = b"--" + (found.group(1) or found.group(2)).encode("latin-1")
    if raw.count(delimiter) > MAX_FORM_PARTS + 1:
        raise RequestRefused(400, f"the form has more than {MAX_FORM_PARTS} fields")
    pieces = raw.split(delimiter)
    if len(pieces) < 3 or not pieces[-1].startswith(b"--"):
        return None  # no part, or no closing delimiter
    fields: dict[str, Any] = {}
    for piece in pieces[1:-1]:
        if not piece.startswith(b"\r\n"):
            return None
        head, sep, body = piece[2:].partition(b"\r\n\r\n")
        if not sep or len(head) > MAX_PART_HEADER_BYTES:
            raise RequestRefused(400, f"a form part's headers are missing or longer than {MAX_PART_HEADER_BYTES:,} "
                                      "bytes")
        headers = email.message.Message()
        names = []
        for line in head.decode("latin-1").split("\r\n"):
            name, colon, value = line.partition(":")
            if not colon:
                raise RequestRefused(400, "a form part has a header line without a colon")
            names.append(name.strip().lower())
            headers[name.strip()] = value.strip()
        if len(set(names)) != len(names) or "content-transfer-encoding" in names:
            raise RequestRefused(400, "a form part gives a header twice or a transfer encoding: send each field once, "
                                      "as plain bytes")
        name = headers.get_param("name", header="content-disposition")
        filename = headers.get_param("filename", header="content-disposition")
        if not isinstance(name, str) or not isinstance(filename, (str, type(None))):
            raise RequestRefused(400, "each form part needs a plain name=\"...\" in its Content-Disposition")
        if name in fields:
            raise RequestRefused(400, f"the form names {name[:40]!r} twice: send each field once")
        body = body[:-2] if body.endswith(b"\r\n") else body
        fields[name] = body if filename is not None else body.decode("utf-8", "replace")
    return fields


def encode_form(fields: dict[str, str], clip: bytes) -> tuple[bytes, str]:
    """A multipart/form-data body of text ``fields`` and the clip as ``file``, and its content type."""
    boundary = "studio-" + os.urandom(12).hex()
    out = b""
    for name, value in fields.items():
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").encode()
    out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"clip\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + clip + f"\r\n--{boundary}--\r\n".encode()
    return out, f"multipart/form-data; boundary={boundary}"


def looks_like_audio(clip: bytes) -> bool:
    """Whether the bytes start like a file soundfile decodes: WAV (RIFF/RF64 WAVE), FLAC, OGG, MP3 (an ID3 tag or a
    frame sync), AIFF, AU."""
    head = clip[:12]
    return (head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE" or head[:4] in (b"fLaC", b"OggS", b".snd")
            or head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0)
            or head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"))


_APPEND_LOCK = threading.Lock()


def _append(path: str, record: dict) -> None:
    line = json.dumps(record, ensure_ascii=False) + "\n"
    with _APPEND_LOCK, open(path, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def _has_completion(path: str, completion_id: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    if json.loads(line).get("id") == completion_id:
                        return True
                except (ValueError, AttributeError):
                    continue
    except FileNotFoundError:
        return False
    return False


def completion_of(response: bytes) -> tuple[str, str] | None:
    """(id, answer text) of a chat completion response: one JSON body, or server-sent events whose deltas are joined;
    None when it is neither (an error body, a cut stream without an id)."""
    text = response.decode("utf-8", errors="replace").strip()
    try:
        if text.startswith("{"):
            data = json.loads(text)
            return str(data["id"]), str(data["choices"][0]["message"].get("content") or "")
        completion_id, parts = "", []
        for line in text.splitlines():
            payload = line[5:].strip() if line.startswith("data:") else ""
            if not payload or payload == "[DONE]":
                continue
            chunk = json.loads(payload)
            completion_id = completion_id or str(chunk.get("id") or "")
            for choice in chunk.get("choices") or []:
                parts.append(str((choice.get("delta") or {}).get("content") or ""))
        return (completion_id, "".join(parts)) if completion_id else None
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None


def json_depth(value: Any) -> int:
    """How deeply ``value`` nests lists and objects (iterative: the value came from a stranger)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if depth > MAX_JSON_DEPTH:
                return depth
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _not_json(constant: str):
    """NaN and Infinity, which Python's json reads but JSON has not: int(Infinity) crashed the gate, and
    an infinite penalty or temperature reached the engine."""
    raise ValueError(f"{constant} is not a JSON number")


def _replay(raw: bytes, original: Callable[[], Awaitable[dict]]) -> Callable[[], Awaitable[dict]]:
    """The rewritten body first, then ``original`` (which reports the client's disconnect)."""
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await original()

    return receive


async def _refuse(send, exc: RequestRefused) -> None:
    extra = [(b"www-authenticate", b"Bearer")] if exc.status == 401 else []
    await _json(send, exc.status, {"error": {"message": exc.message, "type": exc.code, "code": exc.status}}, extra)


async def _json(send, status: int, data: dict, headers: list | None = None) -> None:
    raw = json.dumps(data).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": raw})
