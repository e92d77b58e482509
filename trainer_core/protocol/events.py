"""Typed worker events, written one JSON line each to ``runs/<id>/events.jsonl``.

The worker appends and flushes every line, so the log outlives both processes; the orchestrator's
pump tails it from a saved byte offset through a ``LogFollower`` (its own descriptor on the file, so a
log deleted or replaced while the worker writes is still read to the end), and a line that is not a
valid event is reported and skipped on its own. Numbers are cleaned in exactly one place,
:func:`clean_numbers`, which turns NaN/inf into ``None`` at any depth and remembers which fields they were in
(a NaN loss is news, not noise).

Progress and eval events carry open ``metrics`` (any numeric keys, trainer_core.protocol.metrics) next to their
fixed fields; a log written before they existed decodes with ``metrics == {}`` (an added optional field keeps
SCHEMA_VERSION: readers of either age read both).

Kept whole: the wire format between the worker and the dashboard: the event types, encode/decode and the log's
writer and follower change together under SCHEMA_VERSION (the value rules are protocol/event_rules.py).
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
from typing import IO, Any, ClassVar, NamedTuple

import orjson

from trainer_core.protocol import metrics as open_metrics
from trainer_core.protocol import sandbox
from trainer_core.protocol.event_rules import InvalidEvent, validate_event
from trainer_core.protocol.status import RunStatus

SCHEMA_VERSION = 1
LOG_NAME = "events.jsonl"
READ_BYTES = 4 << 20  # the most the pump reads from one log at a time


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
    metrics: dict = field(default_factory=dict)  # every other numeric key the trainer logged: {key: value}


@dataclass
class EvalEvent(Event):
    kind: ClassVar[str] = "eval"
    step: int
    eval_loss: float | None = None
    metrics: dict = field(default_factory=dict)  # the evaluation's other numeric keys (eval_runtime, eval_rewards/...)


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


@dataclass
class ServeReadyEvent(Event):
    """A serve job's server listens at ``url`` (its OpenAI base URL); ``models``: served name -> label."""

    kind: ClassVar[str] = "serve_ready"
    url: str
    models: dict = field(default_factory=dict)
    engine: str = ""


@dataclass
class EvalSampleEvent(Event):
    """One scored test sample of an eval job (also a line of its predictions.jsonl). Scores are None when
    their metric was not asked for; ``judge`` also when the judge gave no score or was unreachable."""

    kind: ClassVar[str] = "eval_sample"
    index: int
    prompt: str
    reference: str
    answer: str
    exact: float | None = None
    rouge_l: float | None = None
    bleu: float | None = None
    loss: float | None = None
    tokens: int = 0
    judge: float | None = None


@dataclass
class EvalResultEvent(Event):
    """The overall metrics of an eval job, and what it evaluated (the keys of the cached baseline)."""

    kind: ClassVar[str] = "eval_result"
    source_key: str
    base_model: str
    data_fingerprint: str
    settings_hash: str
    metrics: dict
    source_run_id: str = ""
    checkpoint: int | None = None
    data_label: str = ""


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (StatusEvent, WarningEvent, ProgressEvent, EvalEvent, CheckpointEvent, CompleteEvent, ErrorEvent,
                HeartbeatEvent, ServeReadyEvent, EvalSampleEvent, EvalResultEvent)
}


@dataclass
class SampleEvent(Event):
    """One greedy answer to a sample prompt at a training step (samples during training). ``flags`` maps each
    degeneration found (trainer_core.evaluation.samples_check kinds) to what was found."""

    kind: ClassVar[str] = "sample"
    step: int
    index: int  # the prompt's place in the run's sample prompts (0-based)
    prompt: str
    text: str
    new_tokens: int = 0
    flags: dict = field(default_factory=dict)
    audio: str = ""  # a spoken sample (method tts): its WAV file, relative to the run folder (samples/step-...wav)
    # a GRPO rollout with tools: its turns, {role: assistant, content, calls: [{name, arguments (JSON text)}]} and
    # {role: tool, name, content} (event_rules.trajectory_turns); [] for a plain answer
    turns: list = field(default_factory=list)


EVENT_TYPES[SampleEvent.kind] = SampleEvent


@dataclass
class DataEvent(Event):
    """The data a training worker loaded: the fingerprint of those files and the media their rows name (what Resume
    checks against), the rows read from the training files and the eval rows it holds out."""

    kind: ClassVar[str] = "data"
    fingerprint: str
    rows: int = 0
    eval_rows: int = 0


EVENT_TYPES[DataEvent.kind] = DataEvent


def clean_numbers(payload: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Replace non-finite floats with None at any depth (in dicts, lists and tuples; tuples become lists);
    return the cleaned payload and {field: 'nan'|'inf'|'-inf'}, a nested field named by its dotted path
    (``loss``, ``metrics.perplexity``, ``values.2``)."""
    nonfinite: dict[str, str] = {}

    def clean(value: Any, path: str) -> Any:
        if isinstance(value, float):
            if math.isfinite(value):
                return value
            nonfinite[path] = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
            return None
        if isinstance(value, dict):
            return {key: clean(item, f"{path}.{key}") for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(item, f"{path}.{i}") for i, item in enumerate(value)]
        return value

    return {key: clean(value, str(key)) for key, value in payload.items()}, nonfinite


# Built once: json.dumps with any option set builds a new encoder per call (a third of an event's cost).
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def encode(event: Event) -> str:
    payload = dict(event.__dict__)  # the dataclass fields; asdict() deep-copies and costs ~4x more
    payload["kind"] = event.kind
    payload["v"] = SCHEMA_VERSION
    try:
        return _ENCODER.encode(payload)  # allow_nan=False: a NaN or inf anywhere raises ValueError
    except ValueError:
        pass
    # Rare (a diverging run): clean the numbers and name the fields, rather than checking every event.
    previous = payload.pop("nonfinite")
    cleaned, nonfinite = clean_numbers(payload)
    cleaned["nonfinite"] = {**previous, **nonfinite} if nonfinite else previous
    return _ENCODER.encode(cleaned)


class UnknownEvent(InvalidEvent):
    pass


# JSON types each annotation accepts. Exact type checks: a JSON true is not a step, "3" is not a number.
_JSON_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "dict": (dict,), "list": (list,),
               "None": (type(None),)}
# Values a status field may take: a status event never ends a run, a complete event always does.
_ALLOWED = {
    ("status", "status"): frozenset(s.value for s in (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.STOPPING)),
    ("complete", "status"): frozenset(s.value for s in (RunStatus.COMPLETED, RunStatus.STOPPED,
                                                        RunStatus.CANCELLED)),
}


def _field_specs(cls: type[Event]) -> tuple[tuple[str, tuple[type, ...], bool, frozenset | None], ...]:
    """(name, accepted JSON types, required, allowed values) per field, computed once per event kind."""
    specs = []
    for f in dataclasses.fields(cls):
        types = tuple(t for part in str(f.type).split("|") for t in _JSON_TYPES[part.strip()])
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        specs.append((f.name, types, required, _ALLOWED.get((cls.kind, f.name))))
    return tuple(specs)


_SPECS = {kind: (cls, _field_specs(cls)) for kind, cls in EVENT_TYPES.items()}


_ABSENT = object()
_OPEN_METRIC_KINDS = frozenset(("progress", "eval"))  # events whose ``metrics`` are open metric values


def decode(line: str | bytes) -> Event:
    """One log line as its event; InvalidEvent (a ValueError) names the field that is wrong."""
    # orjson parses a line ~7x faster than json.loads (the pump's largest cost per event), and rejects what
    # our writer never writes (NaN/Infinity literals, numbers beyond 64 bits, invalid UTF-8) with a ValueError.
    data = orjson.loads(line)
    if not isinstance(data, dict):
        raise UnknownEvent(f"an event is a JSON object, got {type(data).__name__}")
    kind = data.get("kind")
    spec = _SPECS.get(kind) if isinstance(kind, str) else None
    if spec is None:
        raise UnknownEvent(f"unknown event kind {kind!r}")
    cls, fields = spec
    values = {}
    for name, types, required, allowed in fields:
        value = data.get(name, _ABSENT)
        if value is _ABSENT:
            if required:
                raise InvalidEvent(f"{kind} event without its {name!r} field")
            continue
        if type(value) not in types:
            expected = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise InvalidEvent(f"{kind} event: {name!r} is {value!r}, expected {expected}")
        if allowed is not None and value not in allowed:
            raise InvalidEvent(f"{kind} event: {name!r} is {value!r}, expected one of {', '.join(sorted(allowed))}")
        values[name] = value
    if kind in _OPEN_METRIC_KINDS and "metrics" in values:
        problem = open_metrics.values_problem(values["metrics"])
        if problem:
            raise InvalidEvent(f"{kind} event: 'metrics' {problem}")
    event = cls(**values)
    validate_event(event)
    return event


class EventWriter:
    """Append-only, line-flushed event log. Safe to use from the training loop."""

    def __init__(self, path: Path):
        self.path = Path(path)
        # Unbuffered: each line goes to the kernel in one write() as it is emitted, with no Python-side
        # buffer to flush (the text layer plus flush() cost ~0.7 us more per line).
        self._fh = open(self.path, "ab", buffering=0)  # noqa: SIM115 - held until close()
        self._lock = threading.Lock()  # the heartbeat thread and the training loop both emit

    def emit(self, event: Event) -> None:
        line = (encode(event) + "\n").encode()
        with self._lock:
            if self._fh.closed:
                return
            # In the kernel before emit returns: survives a crash of this process (fsync would cost ~ms per
            # step for power-loss safety). A regular file takes the whole line at once; loop in case it doesn't.
            written = self._fh.write(line)
            while written < len(line):
                written += self._fh.write(line[written:])

    def close(self) -> None:
        with self._lock:
            if self._fh.closed:
                return
            os.fsync(self._fh.fileno())
            self._fh.close()


def last_terminal_event(path: Path, tail_bytes: int = 256 << 10) -> Event | None:
    """The log's final complete/error event, if one is among its last lines (None otherwise)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return _last_terminal_event(fd, tail_bytes)
    finally:
        os.close(fd)


def _last_terminal_event(fd: int, tail_bytes: int) -> Event | None:
    size = os.fstat(fd).st_size
    tail = os.pread(fd, tail_bytes, max(0, size - tail_bytes))
    for raw in reversed(tail.splitlines()):
        try:
            event = decode(raw)
        except (ValueError, TypeError, UnicodeDecodeError):
            continue  # the first line of the window may be cut in half
        if event.kind in ("complete", "error"):
            return event
        if event.kind not in ("heartbeat", "warning", "status"):
            return None  # training went on after any earlier outcome line: there is none
    return None


class LogLine(NamedTuple):
    """One whole line of the log: the offset just after it, its event, or why it carries none."""

    end: int
    event: Event | None
    problem: str = ""  # an invalid line, or what happened to the log file itself


def _next_line(fd: int, line_start: int, block: int) -> int:
    """The offset just after the newline that ends the line starting at ``line_start``; ``line_start``
    itself while that line is still being written (it is read again later)."""
    offset = line_start
    while chunk := os.pread(fd, block, offset):
        end = chunk.find(b"\n")
        if end >= 0:
            return offset + end + 1
        offset += len(chunk)
    return line_start


def read_lines(fd: int, offset: int, max_bytes: int = 4 << 20) -> list[LogLine]:
    """Whole lines after byte ``offset`` (a half-written line waits), each decoded on its own: an invalid
    line is reported and skipped, and never costs the lines around it."""
    chunk = os.pread(fd, max_bytes, offset)
    end = chunk.rfind(b"\n")
    if end < 0:
        if len(chunk) == max_bytes:  # one line longer than a whole read: skip it (the raw log keeps it)
            after = _next_line(fd, offset, max_bytes)
            return [LogLine(after, None, f"skipped a line of {after - offset:,} bytes at byte {offset:,}: "
                                         "longer than one read")] if after != offset else []
        return []
    lines: list[LogLine] = []
    start = 0
    while start <= end:
        stop = chunk.index(b"\n", start)
        raw = chunk[start:stop]
        start = stop + 1
        if not raw.strip():
            lines.append(LogLine(offset + start, None))
            continue
        try:
            lines.append(LogLine(offset + start, decode(raw)))
        except (ValueError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
            shown = raw[:200].decode("utf-8", errors="replace")
            lines.append(LogLine(offset + start, None,
                                 f"skipped an invalid line at byte {offset + start - len(raw) - 1:,} of the "
                                 f"event log ({exc}): {shown}"))
    return lines


def read_new(path: Path, offset: int, max_bytes: int = 4 << 20) -> tuple[list[Event], int]:
    """Events after byte ``offset``; only whole lines are consumed, and invalid lines are skipped."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return [], offset
    try:
        lines = read_lines(fd, offset, max_bytes)
    finally:
        os.close(fd)
    return [line.event for line in lines if line.event is not None], lines[-1].end if lines else offset


class LogFollower:
    """Follows one run's event log through a file descriptor of its own, so a log that is deleted,
    replaced or truncated while the worker writes is still read to its end (the worker keeps appending
    to the file it opened). Changes to the file are reported once each, as ``LogLine`` problems."""

    def __init__(self, path: Path, pid: int | None = None):
        self.path = Path(path)
        self.pid = pid
        self._file: IO[bytes] | None = None  # a file object, so a follower dropped without close() closes it
        self._identity: tuple[int, int] | None = None
        self._reported: set[str] = set()

    def read(self, offset: int, max_bytes: int | None = None) -> list[LogLine]:
        if self._file is None and not self._open():
            if offset > 0 and "missing" not in self._reported:
                self._reported.add("missing")
                return [LogLine(offset, None, f"{LOG_NAME} is missing and no open copy was found: events after "
                                              f"byte {offset:,} cannot be read")]
            return []
        notes = self._check_path(offset)
        fd = self._file.fileno()
        size = os.fstat(fd).st_size
        if size < offset:
            return notes + [LogLine(0, None, f"{LOG_NAME} shrank from {offset:,} to {size:,} bytes; reading it "
                                             "again from its start (stored metrics are merged by step)")]
        return notes + read_lines(fd, offset, max_bytes or READ_BYTES)

    def last_terminal_event(self) -> Event | None:
        if self._file is None and not self._open():
            return None
        return _last_terminal_event(self._file.fileno(), 256 << 10)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _open(self) -> bool:
        """The worker's own log: through its open descriptor when the path no longer leads to it."""
        for candidate in [*self._worker_copies(), self.path]:
            try:
                handle = open(candidate, "rb", buffering=0)  # noqa: SIM115 - held until close()
            except OSError:
                continue
            st = os.fstat(handle.fileno())
            self._file, self._identity = handle, (st.st_dev, st.st_ino)
            return True
        return False

    def _worker_copies(self) -> list[str]:
        """/proc paths of the worker's descriptors on this log (Linux; none elsewhere or when not ours)."""
        if not self.pid:
            return []
        wanted = {str(self.path), f"{self.path} (deleted)"}
        found = []
        for pid in sandbox.process_tree(self.pid):  # a sandboxed worker is a descendant of the recorded process
            fd_dir = f"/proc/{pid}/fd"
            try:
                for name in os.listdir(fd_dir):
                    try:
                        if os.readlink(f"{fd_dir}/{name}") in wanted:
                            found.append(f"{fd_dir}/{name}")
                    except OSError:
                        continue
            except OSError:
                continue
        return found

    def _check_path(self, offset: int) -> list[LogLine]:
        try:
            st = os.stat(self.path)
            change = None if (st.st_dev, st.st_ino) == self._identity else "replaced"
        except FileNotFoundError:
            change = "deleted"
        if change is None or change in self._reported:
            return []
        self._reported.add(change)
        return [LogLine(offset, None, f"{LOG_NAME} was {change} while the run was active; still reading the "
                                      "file the worker writes to (the run folder no longer leads to it)")]


# ====================================================================== export jobs
@dataclass
class ArtifactEvent(Event):
    """An export job published a file (or a folder: ``sha256`` is then that of its SHA256SUMS manifest)."""

    kind: ClassVar[str] = "artifact"
    artifact: str  # adapter, merged, gguf, modelfile, card
    path: str
    size: int
    sha256: str
    source_run_id: str = ""
    detail: str = ""  # the GGUF type, the merged dtype, ...


@dataclass
class VerifyEvent(Event):
    """Greedy answers of an exported format next to the unmerged adapter's, on a prompt set."""

    kind: ClassVar[str] = "verify"
    format: str  # "merged" or "gguf q8_0"
    identical: int
    total: int
    first_difference: str = ""  # where the first differing answer parts from the adapter's ("" when none)
    unit: str = ""  # what ``identical`` counts when not answers ("" = answers identical to the adapter's)


for _cls in (ArtifactEvent, VerifyEvent):  # a block of their own, so other kinds' events stay untouched
    EVENT_TYPES[_cls.kind] = _cls
    _SPECS[_cls.kind] = (_cls, _field_specs(_cls))
