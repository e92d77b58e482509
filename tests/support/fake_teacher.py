"""A deterministic OpenAI-compatible teacher for data-recipe tests: a real HTTP server on loopback, in a thread.

What it answers depends only on the request, so a recipe run twice makes the same rows:
* a prompt holding ``<passage ...>TEXT</passage>`` (the documents Q&A starter): a question and answer about one
  fact of the passage, a fact sentence being "The ATTRIBUTE of ENTITY is VALUE." (tests/support/fake_teacher's
  ``fact_document`` writes such documents); the n-th request about a passage takes its n-th fact (round robin), so a
  passage with one fact asked twice gives a duplicate;
* a prompt asking for JSON within ``<response_schema>`` (Data Designer's structured and judge columns) without a
  passage: a value filled from the schema itself (first enum value, numbers at their minimum or 4, strings naming the
  property), so any structured column gets an answer that validates;
* a prompt holding an OpenAI function tool as JSON (the tool-calls starter): a request and arguments filled from the
  tool's parameter schema; a property named ``sql``: a query that runs against the text-to-SQL starter's schema;
* any other prompt: ``answer from MODEL:`` followed by the prompt's last line, reversed word by word.
Every answer reports ``usage`` (whitespace tokens), as an OpenAI server does.

Misbehaviour, for the failure tests: ``mode`` "garbage" answers prose where JSON was asked for; "error" answers
500; ``down()`` closes the server (connection refused afterwards); ``api_key`` set: requests without it get 401;
``hold_after`` N: chat requests after the N-th wait until ``release`` is set (a job caught mid-generation).
Requests are kept in ``requests`` (the parsed bodies).
"""
from __future__ import annotations

import ast
import hashlib
import json
import re
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PASSAGE = re.compile(r"<passage[^>]*>\s*(.*?)\s*</passage>", re.S)
SCHEMA = re.compile(r"<response_schema>\s*(\{.*?\})\s*</response_schema>", re.S)
TOOL = '{"type": "function"'
FACT = re.compile(r"The ([\w' -]+?) of ([\w' -]+?) is ([\w' -]+?)\.")

ENTITIES = ["Zorbia", "Quillon", "Maravel", "Tessaly", "Ondrik", "Vashmere", "Pellucid Bay", "Harrowgate", "Ysolde",
            "Brannock", "Caldera Vee", "Oskarth", "Lumenfall", "Drezna", "Fennimore", "Saltreach"]
ATTRIBUTES = ["capital", "river", "festival", "mascot", "currency", "founder", "anthem", "mountain"]
VALUES = ["Quellport", "Amberlin", "Sorrowmere", "Kestrel", "Bluefen", "Torvald", "Marigold", "Westerhay",
          "Ironwick", "Pemberlake", "Saffron", "Glimmerdale", "Rookhaven", "Thistlewood", "Copperline", "Duskmoor",
          "Elderglen", "Foxmarsh", "Gildenrow", "Hollowmere", "Juniper", "Larkspur", "Moonfield", "Nettlebrook"]


def facts(count: int, offset: int = 0) -> list[tuple[str, str, str]]:
    """``count`` invented (attribute, entity, value) facts no model knows, no two about the same attribute of the same
    entity (up to 128); deterministic."""
    assert offset + count <= len(ENTITIES) * len(ATTRIBUTES)
    return [(ATTRIBUTES[(i // len(ENTITIES) + i) % len(ATTRIBUTES)], ENTITIES[i % len(ENTITIES)],
             VALUES[(i * 7) % len(VALUES)]) for i in range(offset, offset + count)]


def fact_sentence(attribute: str, entity: str, value: str) -> str:
    return f"The {attribute} of {entity} is {value}."


def fact_document(path: Path, count: int, offset: int = 0, filler: bool = True) -> list[tuple[str, str, str]]:
    """A Markdown document of ``count`` facts, a paragraph each (with a sentence of filler); returns the facts."""
    chosen = facts(count, offset)
    parts = ["# Gazetteer of invented places", ""]
    for attribute, entity, value in chosen:
        parts += [fact_sentence(attribute, entity, value) + (" Travellers mention it often." if filler else ""), ""]
    path.write_text("\n".join(parts))
    return chosen


def fact_files(folder: Path, count: int, offset: int = 0) -> list[tuple[str, str, str]]:
    """One small Markdown file per fact (so one chunk each, asked once per pass over the chunks)."""
    folder.mkdir(parents=True, exist_ok=True)
    chosen = facts(count, offset)
    for i, fact in enumerate(chosen):
        (folder / f"fact-{i:03d}.md").write_text(fact_sentence(*fact) + "\n")
    return chosen


def question(attribute: str, entity: str) -> str:
    return f"What is the {attribute} of {entity}?"


class FakeTeacher:
    def __init__(self, model: str = "teacher", api_key: str = ""):
        self.model = model
        self.api_key = api_key
        self.mode = "ok"
        self.garbage_for = ""  # answers prose instead of JSON to every prompt containing this text
        self.hold_after: int | None = None
        self.delay_s = 0.0  # each chat answer takes this long (a teacher's generation time, for benchmarks)
        self.release = threading.Event()
        self.requests: list[dict] = []
        self._asked: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> "FakeTeacher":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def down(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, prompt: str, model: str = "teacher") -> str:
        passage = PASSAGE.search(prompt)
        schema = SCHEMA.search(prompt)
        if schema and (self.mode == "garbage" or (self.garbage_for and self.garbage_for in prompt)):
            return "Sure! Here is a great answer, but I forgot the JSON."
        if passage:
            found = FACT.findall(passage.group(1))
            with self._lock:
                n = self._asked[passage.group(1)]
                self._asked[passage.group(1)] += 1
            if found:
                attribute, entity, value = found[n % len(found)]
                body = {"question": question(attribute, entity), "answer": fact_sentence(attribute, entity, value),
                        "evidence": fact_sentence(attribute, entity, value)}
            else:
                first = passage.group(1).split(".")[0].strip()
                body = {"question": f"What does the passage say first? ({n})", "answer": first, "evidence": first}
            return "```json\n" + json.dumps(body) + "\n```"
        if schema:
            with self._lock:  # the n-th request of one prompt: its own tag, so a repeated prompt is no repeat
                n = self._asked[prompt]
                self._asked[prompt] += 1
            try:
                body = _fill(json.loads(schema.group(1)), hashlib.sha256(f"{n}:{prompt}".encode()).hexdigest()[:8])
            except ValueError:
                body = {}
            tool = _tool_in(prompt)
            if tool is not None and isinstance(body, dict) and "arguments" in body:
                body["arguments"] = _fill(tool["function"].get("parameters", {}), "")
            return "```json\n" + json.dumps(body) + "\n```"
        last = [line for line in prompt.strip().splitlines() if line.strip()][-1:] or [""]
        return f"answer from {model}: " + " ".join(reversed(last[0].split()))


def _tool_in(prompt: str) -> dict | None:
    """The OpenAI function tool a prompt shows, as JSON or as Python's repr (Data Designer renders a seed's JSON
    object with Python's str)."""
    for marker in ('{"type": "function"', "{'type': 'function'"):
        at = prompt.find(marker)
        if at < 0:
            continue
        depth = 0
        for end in range(at, len(prompt)):
            depth += {"{": 1, "}": -1}.get(prompt[end], 0)
            if depth == 0:
                text = prompt[at:end + 1]
                try:
                    return json.loads(text) if marker.startswith('{"') else ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    return None
    return None


def _fill(schema: dict, tag: str, depth: int = 0, name: str = "value", root: dict | None = None):
    """A value that fits ``schema``: strings name their property (and ``tag``: the prompt's hash, so two prompts get
    two answers)."""
    if depth > 6 or not isinstance(schema, dict):
        return name
    root = schema if root is None else root
    if "$ref" in schema:  # pydantic's schemas (Data Designer's judge columns) name their parts in $defs
        found = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            found = found.get(part, {}) if isinstance(found, dict) else {}
        return _fill(found, tag, depth + 1, name, root)
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return _fill(schema["allOf"][0], tag, depth + 1, name, root)
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return _fill(schema["anyOf"][0], tag, depth + 1, name, root)
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        return {key: _fill(part, tag, depth + 1, key, root) for key, part in schema.get("properties", {}).items()}
    if kind == "array":
        return [_fill(schema.get("items", {}), tag, depth + 1, name, root)]
    if kind == "integer":
        return max(int(schema.get("minimum", 4)), 4) if schema.get("maximum", 99) >= 4 else int(schema["maximum"])
    if kind == "number":
        return float(schema.get("minimum", 4))
    if kind == "boolean":
        return True
    if name == "sql":
        return "SELECT city, COUNT(*) FROM customers GROUP BY city"
    return f"{name} text {tag}".rstrip()


def _handler(fake: FakeTeacher) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if fake.api_key and self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                self._send(401, {"error": {"message": "bad key", "type": "invalid_request_error"}})
                return False
            return True

        def do_GET(self) -> None:
            if self._authorized():
                self._send(200, {"object": "list", "data": [{"id": fake.model, "object": "model", "owned_by": "x"}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            with fake._lock:
                fake.requests.append(body)
                held = fake.hold_after is not None and len(fake.requests) > fake.hold_after
            if held:
                fake.release.wait(120)
            if fake.delay_s:
                time.sleep(fake.delay_s)
            if not self._authorized():
                return
            if fake.mode == "error":
                self._send(500, {"error": {"message": "teacher broke", "type": "server_error"}})
                return
            prompt = "\n".join(_text(m.get("content")) for m in body.get("messages", []) if m.get("role") != "system")
            answer = fake.answer(prompt, str(body.get("model", fake.model)))
            tokens_in, tokens_out = len(prompt.split()), len(answer.split())
            self._send(200, {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0,
                             "model": body.get("model", fake.model),
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out,
                                       "total_tokens": tokens_in + tokens_out}})

    return Handler


def _text(content) -> str:
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content or "")
