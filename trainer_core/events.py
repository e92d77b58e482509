"""Typed worker events, written one JSON line each to ``runs/<id>/events.jsonl``.

The worker appends and flushes every line, so the log outlives both processes; the orchestrator's
pump tails it from a saved byte offset. Numbers are cleaned in exactly one place,
:func:`clean_numbers`, which turns NaN/inf into ``None`` and remembers which fields they were in
(a NaN loss is news, not noise).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

SCHEMA_VERSION = 1


@dataclass
class Event:
    kind: ClassVar[str] = "event"
    ts: float = field(default_factory=time.time, kw_only=True)
    nonfinite: dict = field(default_factory=dict, kw_only=True)


@dataclass
class StatusEvent(Event):
    """The run entered a new status or phase (loading model, preparing data, training, saving)."""

    kind: ClassVar[str] = "status"
    status: str
    phase: str = ""
    message: str = ""
    engine: str = ""


@dataclass
class WarningEvent(Event):
    kind: ClassVar[str] = "warning"
    message: str


@dataclass
class ProgressEvent(Event):
    kind: ClassVar[str] = "progress"
    step: int
    total_steps: int
    epoch: float | None = None
    loss: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    tokens_seen: int | None = None
    tokens_per_s: float | None = None
    memory_mb: float | None = None
    elapsed_s: float | None = None
    eta_s: float | None = None


@dataclass
class EvalEvent(Event):
    kind: ClassVar[str] = "eval"
    step: int
    eval_loss: float | None = None


@dataclass
class CheckpointEvent(Event):
    kind: ClassVar[str] = "checkpoint"
    step: int
    path: str


@dataclass
class CompleteEvent(Event):
    """Training ended on its own or on request; ``status`` is completed, stopped or cancelled."""

    kind: ClassVar[str] = "complete"
    status: str
    output_dir: str = ""
    steps: int = 0
    final_loss: float | None = None


@dataclass
class ErrorEvent(Event):
    kind: ClassVar[str] = "error"
    message: str
    exc_type: str = ""
    traceback: str = ""


@dataclass
class HeartbeatEvent(Event):
    kind: ClassVar[str] = "heartbeat"
    pid: int = 0


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (StatusEvent, WarningEvent, ProgressEvent, EvalEvent, CheckpointEvent, CompleteEvent, ErrorEvent,
                HeartbeatEvent)
}


def clean_numbers(payload: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Replace non-finite floats with None; return the cleaned payload and {field: 'nan'|'inf'|'-inf'}."""
    cleaned: dict[str, Any] = {}
    nonfinite: dict[str, str] = {}
    for key, value in payload.items():
        if isinstance(value, float) and not math.isfinite(value):
            nonfinite[key] = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
            cleaned[key] = None
        else:
            cleaned[key] = value
    return cleaned, nonfinite


def encode(event: Event) -> str:
    payload = dataclasses.asdict(event)
    previous = payload.pop("nonfinite")
    cleaned, nonfinite = clean_numbers(payload)
    cleaned["nonfinite"] = {**previous, **nonfinite}
    cleaned["kind"] = event.kind
    cleaned["v"] = SCHEMA_VERSION
    return json.dumps(cleaned, allow_nan=False, separators=(",", ":"))


class UnknownEvent(ValueError):
    pass


def decode(line: str) -> Event:
    data = json.loads(line)
    if not isinstance(data, dict):
        raise UnknownEvent(f"an event is a JSON object, got {type(data).__name__}")
    kind = data.pop("kind", None)
    data.pop("v", None)
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        raise UnknownEvent(f"unknown event kind {kind!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


class EventWriter:
    """Append-only, line-flushed event log. Safe to use from the training loop."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fh = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()  # the heartbeat thread and the training loop both emit

    def emit(self, event: Event) -> None:
        line = encode(event) + "\n"
        with self._lock:
            if self._fh.closed:
                return
            self._fh.write(line)
            self._fh.flush()  # survives a crash of this process; fsync would cost ~ms per step for power-loss safety

    def close(self) -> None:
        with self._lock:
            if self._fh.closed:
                return
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()


def last_terminal_event(path: Path, tail_bytes: int = 256 << 10) -> Event | None:
    """The log's final complete/error event, if one is among its last lines (None otherwise)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - tail_bytes))
            tail = fh.read()
    except FileNotFoundError:
        return None
    for raw in reversed(tail.splitlines()):
        try:
            event = decode(raw.decode("utf-8"))
        except (ValueError, TypeError, UnicodeDecodeError):
            continue  # the first line of the window may be cut in half
        if event.kind in ("complete", "error"):
            return event
        if event.kind not in ("heartbeat", "warning", "status"):
            return None  # training went on after any earlier outcome line: there is none
    return None


def _next_line(path: Path, line_start: int, block: int) -> int:
    """The offset just after the newline that ends the line starting at ``line_start``; ``line_start``
    itself while that line is still being written (it is read again later)."""
    offset = line_start
    with open(path, "rb") as fh:
        fh.seek(offset)
        while chunk := fh.read(block):
            end = chunk.find(b"\n")
            if end >= 0:
                return offset + end + 1
            offset += len(chunk)
    return line_start


def read_new(path: Path, offset: int, max_bytes: int = 4 << 20) -> tuple[list[Event], int]:
    """Events after byte ``offset``; only whole lines are consumed, so a half-written line waits."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read(max_bytes)
    except FileNotFoundError:
        return [], offset
    end = chunk.rfind(b"\n")
    if end < 0:
        if len(chunk) == max_bytes:  # one line longer than a whole read: skip it (the raw log keeps it)
            return [], _next_line(path, offset, max_bytes)
        return [], offset
    events: list[Event] = []
    for raw in chunk[: end + 1].splitlines():
        if not raw.strip():
            continue
        try:
            events.append(decode(raw.decode("utf-8")))
        except (ValueError, TypeError):
            continue  # a corrupt or future line must not stall the pump; the raw log keeps it
    return events, offset + end + 1
