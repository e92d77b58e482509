"""Dataset files in, one trainable shape out.

Every supported layout (alpaca, chatml, sharegpt, raw text) becomes either chat rows
``{"messages": [{"role": ..., "content": ...}, ...]}`` or text rows ``{"text": ...}``. Problems
are raised as ``DatasetError(field, message)`` so the form can show them next to the field that
fixes them. The dashboard imports this module: no torch, transformers or ``datasets`` at module
level (``load_hub`` imports ``datasets`` itself and only runs in the worker).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import random
import re
import secrets
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from trainer_core.protocol import paths
from trainer_core.config import BUNDLED_DATASET, FORMAT_TYPES, FieldError, TrainConfig

SUPPORTED_EXTENSIONS = (".jsonl", ".json", ".csv", ".parquet")
CHAT_FORMATS = ("alpaca", "chatml", "sharegpt")
REQUIRED_COLUMNS = {
    "alpaca": ("instruction", "output"),
    "chatml": ("messages",),
    "sharegpt": ("conversations",),
    "text": ("text",),
}
FORMAT_NEEDS = {
    "alpaca": "'instruction' and 'output' columns (and optionally 'input')",
    "chatml": "a 'messages' column holding a list of {role, content} turns",
    "sharegpt": "a 'conversations' column holding a list of {from, value} turns",
    "text": "a 'text' column of raw text",
}
ROLE_ALIASES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant"}
COLUMN_KEYS = ("instruction", "input", "output", "messages", "conversations", "text")
TURN_KEYS = ("role", "content", "from", "value")
MAPPING_KEYS = COLUMN_KEYS + TURN_KEYS + tuple(ROLE_ALIASES)

_DETECT_SAMPLE = 100  # rows inspected to tell role/content turns from from/value turns
_CACHE_SIZE = 4  # parsed files kept in memory ...
_CACHE_BYTES = 128 * 2**20  # ... up to this much file size: a 50 MB JSONL is ~300 MB of Python objects
_CSV_FIELD_LIMIT = 64 * 2**20  # the csv module's default (128 KiB per cell) rejects long documents


class DatasetError(ValueError):
    """A dataset problem, naming the config field that fixes it."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


@dataclass
class NormalizedData:
    """Rows in the trainer's shape, plus what was detected and what was dropped (reason -> count)."""

    format: str
    reason: str
    rows: list[dict]
    dropped: dict[str, int] = field(default_factory=dict)
    drop_examples: dict[str, list[str]] = field(default_factory=dict)  # reason -> a few distinct examples

    def drop_warning(self, what: str = "training rows") -> str | None:
        """All drops in ONE message (reason, count, a few examples): thousands of rows with made-up roles
        must not become thousands of warnings."""
        if not self.dropped:
            return None
        total = sum(self.dropped.values())
        parts = []
        for reason, count in sorted(self.dropped.items(), key=lambda item: (-item[1], item[0])):
            examples = self.drop_examples.get(reason, [])
            parts.append(f"{reason}: {count:,}" + (f" (e.g. {', '.join(examples)})" if examples else ""))
        return f"Dropped {total:,} of {total + len(self.rows):,} {what}: " + "; ".join(parts)

    @property
    def is_chat(self) -> bool:
        return self.format != "text"

    def summary(self) -> str:
        text = f"{len(self.rows)} rows, {self.format} ({self.reason})"
        if self.dropped:
            details = ", ".join(f"{reason}: {count}" for reason, count in sorted(self.dropped.items()))
            text += f"; dropped {sum(self.dropped.values())} ({details})"
        return text


# ---------------------------------------------------------------------- sources
def bundled_demo_path() -> Path:
    return Path(__file__).resolve().parent / "data" / "demo_chat.jsonl"


def resolve_source(source: str, field_name: str = "local_datasets") -> Path:
    """The file or folder a config entry points at, kept inside the allowed roots."""
    source = str(source).strip()
    if not source:
        raise DatasetError(field_name, "an entry is empty: give a file path, or remove the entry")
    if source == BUNDLED_DATASET:
        path = bundled_demo_path()
        if not path.is_file():
            raise DatasetError(field_name, f"the bundled demo dataset is missing from this install ({path}): "
                                           "reinstall Finetune Studio or run scripts/make_demo_dataset.py")
        return path
    problem = paths.path_problem(source)
    if problem:
        raise DatasetError(field_name, problem)
    candidate = Path(source).expanduser()
    if not candidate.is_absolute() and not candidate.exists() and (paths.datasets_dir() / candidate).exists():
        candidate = paths.datasets_dir() / candidate  # a bare name refers to an uploaded file
    try:
        path = paths.resolve_inside(candidate, paths.allowed_data_roots())
    except paths.UnsafePathError as exc:
        raise DatasetError(field_name, f"{exc}. Upload the file, move it under {paths.data_root()}, "
                                       "or add its folder to FINETUNE_STUDIO_ALLOWED_ROOTS.") from None
    if not path.exists():
        raise DatasetError(field_name, f"{source} does not exist: check the path or upload the file")
    return path


def source_files(path: Path, field_name: str) -> list[Path]:
    """A file stays itself; a folder means every supported file directly inside it, by name."""
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.iterdir()
                   if p.is_file() and p.suffix.lower() in SUPPORTED_EXTENSIONS and not p.name.startswith("."))
    if not files:
        raise DatasetError(field_name, f"folder {path} has no {'/'.join(SUPPORTED_EXTENSIONS)} files")
    try:  # a symlink inside an allowed folder must not lead out of it
        return [paths.resolve_inside(p, paths.allowed_data_roots()) for p in files]
    except paths.UnsafePathError as exc:
        raise DatasetError(field_name, f"{exc}. Remove the link or copy the file into the folder.") from None


# ---------------------------------------------------------------------- reading
_read_cache: OrderedDict[tuple[str, int, int], list[dict]] = OrderedDict()
_read_lock = threading.Lock()


def read_rows(path: Path, field_name: str = "local_datasets") -> list[dict]:
    """Rows of a .jsonl/.json/.csv/.parquet file (or of every such file in a folder).

    Parsed files are cached by (path, mtime, size): treat the returned rows as read-only.
    """
    path = Path(path)
    if path.is_dir():
        return [row for file in source_files(path, field_name) for row in read_rows(file, field_name)]
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_EXTENSIONS:
        raise DatasetError(field_name, f"{path.name}: unsupported file type '{suffix or '(none)'}'; "
                                       f"use one of {', '.join(SUPPORTED_EXTENSIONS)}")
    try:
        stat = path.stat()
    except OSError as exc:
        raise DatasetError(field_name, f"cannot read {path}: {exc.strerror or exc}") from None
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    with _read_lock:
        if key in _read_cache:
            _read_cache.move_to_end(key)
            return _read_cache[key]
    rows = _parse(path, suffix, field_name)
    if not rows:
        raise DatasetError(field_name, f"{path.name} has no rows")
    with _read_lock:
        _read_cache[key] = rows
        while len(_read_cache) > 1 and (len(_read_cache) > _CACHE_SIZE
                                        or sum(size for _, _, size in _read_cache) > _CACHE_BYTES):
            _read_cache.popitem(last=False)
    return rows


def _parse(path: Path, suffix: str, field_name: str) -> list[dict]:
    if suffix == ".parquet":
        return _parse_parquet(path, field_name)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DatasetError(field_name, f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise DatasetError(field_name, f"{path.name} is not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}): "
                                       "re-save it as UTF-8 (in Excel: Save As > CSV UTF-8)") from None
    if suffix == ".jsonl":
        return _parse_jsonl(text, path.name, field_name)
    if suffix == ".json":
        return _parse_json(text, path.name, field_name)
    return _parse_csv(text, path.name, field_name)


_TOO_DEEP = ("nests lists or objects too deeply to read (hundreds of levels, such as [[[...]]]); a row is an "
             "object of text fields or a list of chat turns: fix the file")


def _parse_jsonl(text: str, name: str, field_name: str) -> list[dict]:
    rows = []
    # split on \n only: str.splitlines would also split on U+2028 inside unescaped JSON strings
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(field_name, f"{name}: line {number} is not valid JSON: {exc.msg} (column {exc.colno}). "
                                           "Fix or remove that line.") from None
        except RecursionError:
            raise DatasetError(field_name, f"{name}: line {number} {_TOO_DEEP}") from None
        if not isinstance(row, dict):
            raise DatasetError(field_name, f"{name}: line {number} is not a JSON object (got {type(row).__name__}); "
                                           "each line must be one row such as {\"text\": \"...\"}")
        rows.append(row)
    return rows


def _parse_json(text: str, name: str, field_name: str) -> list[dict]:
    if not text.strip():
        return []
    try:
        data = json.loads(text)
    except RecursionError:
        raise DatasetError(field_name, f"{name} {_TOO_DEEP}") from None
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # several objects one after another: a JSONL file named .json
            return _parse_jsonl(text, name, field_name)
        raise DatasetError(field_name, f"{name} is not valid JSON: {exc.msg} at line {exc.lineno} "
                                       f"column {exc.colno}") from None
    if isinstance(data, dict):
        lists = [key for key, value in data.items() if isinstance(value, list)]
        if len(lists) == 1 and lists[0] not in ("messages", "conversations"):
            data = data[lists[0]]
        elif lists and set(lists) <= {"messages", "conversations"}:
            data = [data]  # a single conversation
        else:
            keys = _quoted(list(data))[:200]
            raise DatasetError(field_name, f"{name} holds a JSON object with keys {keys}; expected "
                                           "a list of rows, or an object with one list such as {\"data\": [...]}")
    if not isinstance(data, list):
        raise DatasetError(field_name, f"{name} must hold a list of rows, got {type(data).__name__}")
    for index, row in enumerate(data, start=1):
        if not isinstance(row, dict):
            raise DatasetError(field_name, f"{name}: row {index} is not a JSON object (got {type(row).__name__})")
    return data


def _parse_csv(text: str, name: str, field_name: str) -> list[dict]:
    csv.field_size_limit(max(csv.field_size_limit(), _CSV_FIELD_LIMIT))
    # strict: an unbalanced quote is an error, not a cell that silently swallows the rest of the file
    reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
    rows = []
    start = 1  # the line the record being read starts on (a quoted cell may span lines)
    try:
        reader.fieldnames  # noqa: B018 - reads the header row
        start = reader.line_num + 1
        for row in reader:
            row.pop(None, None)  # cells beyond the header have no column name
            rows.append(row)
            start = reader.line_num + 1
    except csv.Error as exc:
        raise DatasetError(field_name, f"{name}: line {start} is not valid CSV ({exc}). Check the quotes on that "
                                       "line: a cell that contains a quote must be wrapped in quotes and "
                                       "double it (\"\")") from None
    return rows


def _parse_parquet(path: Path, field_name: str) -> list[dict]:
    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(field_name, f"{path.name} is not a readable Parquet file: {exc}") from None


# ---------------------------------------------------------------------- mapping
@dataclass(frozen=True)
class _Mapping:
    """custom_format_mapping split into column renames, turn-key renames and role-name aliases."""

    columns: dict[str, str]
    turn: dict[str, str]
    roles: dict[str, str]

    def col(self, name: str) -> str:
        return self.columns.get(name, name)

    @classmethod
    def parse(cls, mapping: dict[str, str] | None) -> "_Mapping":
        mapping = dict(mapping or {})
        unknown = [key for key in mapping if key not in MAPPING_KEYS]
        if unknown:
            raise DatasetError("custom_format_mapping", f"unknown name {_quoted(unknown)}: map one of "
                                                        f"{', '.join(MAPPING_KEYS)} onto your column names")
        empty = [key for key, value in mapping.items() if not isinstance(value, str) or not value.strip()]
        if empty:
            raise DatasetError("custom_format_mapping", f"{_quoted(empty)} maps to nothing: name one of your columns")
        roles = dict(ROLE_ALIASES)
        roles.update({mapping[key].strip().lower(): ROLE_ALIASES[key] for key in ROLE_ALIASES if key in mapping})
        return cls(columns={k: v for k, v in mapping.items() if k in COLUMN_KEYS},
                   turn={k: v for k, v in mapping.items() if k in TURN_KEYS},
                   roles=roles)


# ---------------------------------------------------------------------- detection
def detect_format(rows: list[dict]) -> tuple[str, str]:
    """(format, reason): which layout the rows are in, and a sentence saying why."""
    return _detect(rows, _Mapping.parse(None), _columns(rows))


def _detect(rows: list[dict], m: _Mapping, columns: list[str]) -> tuple[str, str]:
    def found(name: str) -> str:
        column = m.col(name)
        return f"'{column}' (mapped to '{name}')" if column != name else f"'{name}'"

    for fmt, name in (("chatml", "messages"), ("sharegpt", "conversations")):
        if m.col(name) in columns:
            shape = _turn_shape(rows, m.col(name), m)
            if shape:
                return fmt, f"found a {found(name)} column with {shape} turns"
    if m.col("instruction") in columns and m.col("output") in columns:
        names = ["instruction", "input", "output"] if m.col("input") in columns else ["instruction", "output"]
        listed = ", ".join(found(n) for n in names[:-1]) + f" and {found(names[-1])}"
        return "alpaca", f"found {listed} columns"
    if m.col("text") in columns:
        return "text", f"found a {found('text')} column of raw text"
    needs = "; ".join(f"{fmt} needs {what}" for fmt, what in FORMAT_NEEDS.items())
    raise DatasetError("format_type", f"could not tell the format: the columns are {_quoted(columns)}. {needs}. "
                                      "Rename your columns, or map them with custom_format_mapping "
                                      "(e.g. {instruction: question, output: answer}).")


def _turn_shape(rows: list[dict], column: str, m: _Mapping) -> str | None:
    """'role/content' or 'from/value' when the column holds lists of turns; None when it does not."""
    saw_list = False
    for index, row in enumerate(rows):
        if saw_list and index >= _DETECT_SAMPLE:
            break
        turns = _as_turn_list(row.get(column))
        if turns is None:
            continue
        saw_list = True
        if not turns:
            continue
        first = turns[0]
        if isinstance(first, dict):
            if m.turn.get("role", "role") in first or m.turn.get("content", "content") in first:
                return "role/content"
            if m.turn.get("from", "from") in first or m.turn.get("value", "value") in first:
                return "from/value"
        return None  # turns of an unknown shape: not a chat column
    if not saw_list:
        return None
    return "from/value" if column == "conversations" else "role/content"  # only empty lists: assume the usual shape


def _as_turn_list(value: Any) -> list | None:
    if isinstance(value, str) and value.lstrip().startswith("["):  # chat turns stored as JSON text (CSV)
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):  # RecursionError: nested deeper than Python parses
            return None
    return value if isinstance(value, list) else None


def _columns(rows: list[dict]) -> list[str]:
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    return [str(c) for c in seen]


def _quoted(names: list[str]) -> str:
    """'a', 'b' and 'c' (at most 20 names shown)."""
    if not names:
        return "(none)"
    shown = [f"'{n}'" for n in names[:20]]
    if len(names) > 20:
        return ", ".join(shown) + f" and {len(names) - 20} more"
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + f" and {shown[-1]}"


# ---------------------------------------------------------------------- normalisation
def normalize_rows(rows: list[dict], format_type: str, mapping: dict[str, str] | None = None,
                   system_prompt: str = "", field_name: str = "local_datasets") -> NormalizedData:
    """Rows in the trainer's shape. Unusable rows are dropped and counted; none usable is an error."""
    data = _normalize(rows, format_type, mapping, system_prompt)
    if not data.rows:
        raise _no_usable_rows(field_name, len(rows), data.dropped)
    return data


def _normalize(rows: list[dict], format_type: str, mapping: dict[str, str] | None,
               system_prompt: str) -> NormalizedData:
    if format_type not in FORMAT_TYPES:
        raise DatasetError("format_type", f"unknown format '{format_type}': choose one of {', '.join(FORMAT_TYPES)}")
    m = _Mapping.parse(mapping)
    columns = _columns(rows)
    if format_type == "auto":
        try:
            fmt, reason = _detect(rows, m, columns)
        except DatasetError:
            _require_mapped_columns(m, columns)  # a mapping to a missing column is the likelier mistake
            raise
    else:
        fmt, reason = format_type, f"format_type is set to '{format_type}'"
        _require_columns(rows, fmt, m, columns)
    convert = _CONVERTERS[fmt]
    system = system_prompt.strip()
    out: list[dict] = []
    dropped: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    for row in rows:
        value, problem = convert(row, m)
        if problem:
            why, example = problem if isinstance(problem, tuple) else (problem, None)
            dropped[why] += 1
            shown = examples.setdefault(why, [])
            if example is not None and len(shown) < MAX_DROP_EXAMPLES and example not in shown:
                shown.append(example)
        elif fmt == "text":
            out.append({"text": value})
        else:
            if system and value[0]["role"] != "system":
                value.insert(0, {"role": "system", "content": system})
            out.append({"messages": value})
    return NormalizedData(format=fmt, reason=reason, rows=out, dropped=dict(dropped),
                          drop_examples={k: v for k, v in examples.items() if v})


def _require_columns(rows: list[dict], fmt: str, m: _Mapping, columns: list[str]) -> None:
    """Columns a format needs must exist in at least one row; say which are missing and how to fix it."""
    missing = [name for name in REQUIRED_COLUMNS[fmt] if m.col(name) not in columns]
    if not missing:
        return
    _require_mapped_columns(m, columns, only=missing)
    try:
        other, why = _detect(rows, m, columns)
        hint = f" This looks like {other} data ({why}): set format_type to '{other}' or 'auto'."
    except DatasetError:
        hint = (f" Rename your columns, or map them with custom_format_mapping "
                f"(e.g. {{{missing[0]}: <your column>}}).")
    verb = "is" if len(missing) == 1 else "are"
    raise DatasetError("format_type", f"format '{fmt}' needs {FORMAT_NEEDS[fmt]}, but {_quoted(missing)} {verb} "
                                      f"missing; the columns are {_quoted(columns)}.{hint}")


def _require_mapped_columns(m: _Mapping, columns: list[str], only: list[str] | None = None) -> None:
    names = only if only is not None else list(m.columns)
    mapped = [name for name in names if name in m.columns and m.col(name) not in columns]
    if mapped:
        maps = ", ".join(f"{name} to '{m.col(name)}'" for name in mapped)
        raise DatasetError("custom_format_mapping", f"maps {maps}, but the data has no such column; the columns are "
                                                    f"{_quoted(columns)}. Map to one of these columns.")


def _text_value(value: Any) -> tuple[str | None, str | None]:
    """(text, None) or (None, 'missing' | 'not text'). Numbers count as text: CSV-free sources keep them typed."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None, "missing"
    if isinstance(value, bool):
        return None, "not text"
    if isinstance(value, (int, float)):
        return str(value), None
    if isinstance(value, str):
        return (value, None) if value.strip() else (None, "missing")
    return None, "not text"


def _field_problem(name: str, problem: str) -> str:
    return f"missing {name}" if problem == "missing" else f"{name} is not text"


def _alpaca(row: dict, m: _Mapping) -> tuple[Any, str | None]:
    instruction, problem = _text_value(row.get(m.col("instruction")))
    if problem:
        return None, _field_problem("instruction", problem)
    output, problem = _text_value(row.get(m.col("output")))
    if problem:
        return None, _field_problem("output", problem)
    extra, problem = _text_value(row.get(m.col("input")))
    if problem == "not text":
        return None, _field_problem("input", problem)
    user = f"{instruction}\n\n{extra}" if extra else instruction
    return [{"role": "user", "content": user}, {"role": "assistant", "content": output}], None


def _chat(column: str):
    def convert(row: dict, m: _Mapping) -> tuple[Any, str | tuple[str, str] | None]:
        raw = row.get(m.col(column))
        if raw is None:
            return None, f"missing {column}"
        turns = _as_turn_list(raw)
        if turns is None:
            return None, f"{column} is not a list of turns"
        role_keys = (m.turn.get("role", "role"), m.turn.get("from", "from"))
        content_keys = (m.turn.get("content", "content"), m.turn.get("value", "value"))
        messages = []
        for turn in turns:
            if not isinstance(turn, dict):
                return None, "malformed turn"
            role_key = next((k for k in role_keys if k in turn), None)
            content_key = next((k for k in content_keys if k in turn), None)
            if role_key is None or content_key is None or not isinstance(turn[role_key], str):
                return None, "malformed turn"
            role = m.roles.get(turn[role_key].strip().lower())
            if role is None:  # one reason for every unknown role; the role itself is kept as an example
                return None, (UNSUPPORTED_ROLE, repr(turn[role_key][:40]))
            content, problem = _text_value(turn[content_key])
            if problem == "not text":
                return None, "malformed turn"
            if content is not None:  # an empty turn teaches nothing; keep the rest of the conversation
                messages.append({"role": role, "content": content})
        if not messages:
            return None, "empty conversation"
        roles = {message["role"] for message in messages}
        if "assistant" not in roles:
            return None, "no assistant turn"
        if "user" not in roles:
            return None, "no user turn"
        return messages, None

    return convert


def _text(row: dict, m: _Mapping) -> tuple[Any, str | None]:
    text, problem = _text_value(row.get(m.col("text")))
    return (None, _field_problem("text", problem)) if problem else (text, None)


UNSUPPORTED_ROLE = "unsupported role (map it in custom_format_mapping, e.g. {bot: assistant})"
MAX_DROP_EXAMPLES = 3

_CONVERTERS = {"alpaca": _alpaca, "chatml": _chat("messages"), "sharegpt": _chat("conversations"), "text": _text}


def _no_usable_rows(field_name: str, total: int, dropped: dict[str, int]) -> DatasetError:
    details = ", ".join(f"{reason}: {count}" for reason, count in sorted(dropped.items()))
    return DatasetError(field_name, f"no usable rows: all {total} rows were dropped ({details or 'no rows'}). "
                                    "Check the format and column mapping.")


# ---------------------------------------------------------------------- loading (several files)
_Part = tuple[str, list[dict]]  # (file name for messages, rows)


def _read_sources(sources: list[str], field_name: str) -> tuple[list[_Part], list[tuple], list[DatasetError]]:
    """Every source's files read, with their cache keys; problems are collected, not raised."""
    parts: list[_Part] = []
    keys: list[tuple] = []
    errors: list[DatasetError] = []
    for source in sources:
        try:
            files = source_files(resolve_source(source, field_name), field_name)
            for file in files:
                rows = read_rows(file, field_name)
                stat = file.stat()
                parts.append((file.name, rows))
                keys.append((str(file), stat.st_mtime_ns, stat.st_size))
        except DatasetError as exc:
            errors.append(exc)
    return parts, keys, errors


def _slice_parts(parts: list[_Part], start: int, end: int) -> list[_Part]:
    """Rows [start, end) of the files taken one after another (end 0: to the end)."""
    if start < 0 or end < 0 or (end and end <= start):
        raise DatasetError("dataset_slice_end", "must be greater than dataset_slice_start (or 0 for 'to the end')")
    total = sum(len(rows) for _, rows in parts)
    stop = min(end, total) if end else total
    if start >= stop:
        raise DatasetError("dataset_slice_start", f"the slice starts at row {start}, but the training data has only "
                                                  f"{total} rows: lower dataset_slice_start or set it to 0")
    sliced, offset = [], 0
    for label, rows in parts:
        lo, hi = max(start - offset, 0), min(stop - offset, len(rows))
        if lo < hi:
            sliced.append((label, rows[lo:hi]))
        offset += len(rows)
    return sliced


def _labels(parts: list[_Part]) -> str:
    return ", ".join(dict.fromkeys(label for label, _ in parts))


def _normalize_parts(parts: list[_Part], cfg: TrainConfig, field_name: str) -> NormalizedData:
    """Each file detected and normalised on its own (files may differ in layout), then merged."""
    results = []
    for label, rows in parts:
        try:
            results.append(_normalize(rows, cfg.format_type, cfg.custom_format_mapping, cfg.system_prompt))
        except DatasetError as exc:
            raise DatasetError(exc.field, f"{label}: {exc.message}") from None
    return _merge(parts, results, field_name)


def _merge(parts: list[_Part], results: list[NormalizedData], field_name: str) -> NormalizedData:
    labels = [label for label, _ in parts]
    text = [label for label, r in zip(labels, results) if not r.is_chat]
    chat = [label for label, r in zip(labels, results) if r.is_chat]
    if text and chat:
        raise DatasetError(field_name, f"mixes raw text ({', '.join(text)}) with chat data ({', '.join(chat)}): "
                                       "train on one kind at a time")
    reasons = list(dict.fromkeys(r.reason for r in results))
    reason = reasons[0] if len(reasons) == 1 else "; ".join(f"{label}: {r.reason}" for label, r in zip(labels, results))
    dropped: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    for r in results:
        dropped.update(r.dropped)
        for key, shown in r.drop_examples.items():
            kept = examples.setdefault(key, [])
            kept.extend(e for e in shown if e not in kept)
            del kept[MAX_DROP_EXAMPLES:]
    merged = NormalizedData(format="+".join(dict.fromkeys(r.format for r in results)), reason=reason,
                            rows=[row for r in results for row in r.rows], dropped=dict(dropped),
                            drop_examples=examples)
    if not merged.rows:
        problem = _no_usable_rows(field_name, sum(len(rows) for _, rows in parts), merged.dropped)
        raise DatasetError(field_name, f"{_labels(parts)}: {problem.message}")
    return merged


def _usage_problems(data: NormalizedData, cfg: TrainConfig, field_name: str, what: str) -> list[DatasetError]:
    """Settings that the detected data contradicts (explicit contradictions are config.py's job)."""
    problems = []
    if cfg.training_type == "cpt" and data.is_chat and cfg.format_type in ("auto", "text"):
        problems.append(DatasetError(field_name, f"continued pretraining (cpt) trains on raw text, but {what} holds "
                                                 f"{data.format} chat data ({data.reason}): use a dataset with a "
                                                 "'text' column, or choose LoRA or full fine-tuning"))
    if not data.is_chat and cfg.system_prompt.strip():
        problems.append(DatasetError("system_prompt", f"raw text has no conversations to add a system prompt to "
                                                      f"({data.reason}): clear the system prompt or use chat data"))
    if not data.is_chat and cfg.train_on_completions and cfg.format_type == "auto":
        problems.append(DatasetError("train_on_completions", f"raw text has no completions ({data.reason}): "
                                                             "turn this off or use chat data"))
    return problems


def load_local(sources: list[str], cfg: TrainConfig, field_name: str = "local_datasets",
               apply_slice: bool = True) -> NormalizedData:
    """Read every source, apply the config's slice, normalise. Raises the first problem found."""
    parts, _, errors = _read_sources(sources, field_name)
    if errors:
        raise errors[0]
    if not parts:
        raise DatasetError(field_name, "no dataset files given")
    if apply_slice:
        parts = _slice_parts(parts, cfg.dataset_slice_start, cfg.dataset_slice_end)
    data = _normalize_parts(parts, cfg, field_name)
    problems = _usage_problems(data, cfg, field_name, _labels(parts))
    if problems:
        raise problems[0]
    return data


_check_cache: OrderedDict[tuple, list[FieldError]] = OrderedDict()


def check_sources(sources: list[str], cfg: TrainConfig, field_name: str) -> list[FieldError]:
    """Every problem with these sources under this config, for ``TrainConfig.validate``."""
    parts, keys, read_errors = _read_sources(sources, field_name)
    errors = [FieldError(e.field, e.message) for e in read_errors]
    if not parts:
        return errors
    apply_slice = field_name == "local_datasets"
    key = (field_name, tuple(keys), cfg.format_type, tuple(sorted(cfg.custom_format_mapping.items())),
           cfg.system_prompt, cfg.training_type, cfg.train_on_completions,
           (cfg.dataset_slice_start, cfg.dataset_slice_end) if apply_slice else None)
    with _read_lock:
        if key in _check_cache:
            _check_cache.move_to_end(key)
            return errors + list(_check_cache[key])
    found = _check_parts(parts, cfg, field_name, apply_slice)
    with _read_lock:
        _check_cache[key] = found
        while len(_check_cache) > 4 * _CACHE_SIZE:
            _check_cache.popitem(last=False)
    return errors + list(found)


def _check_parts(parts: list[_Part], cfg: TrainConfig, field_name: str, apply_slice: bool) -> list[FieldError]:
    problems: list[DatasetError] = []
    results = []
    for label, rows in parts:
        try:
            results.append(normalize_rows(rows, cfg.format_type, cfg.custom_format_mapping, cfg.system_prompt,
                                          field_name=field_name))
        except DatasetError as exc:
            problems.append(DatasetError(exc.field, f"{label}: {exc.message}"))
    if not problems:
        start, end = cfg.dataset_slice_start, cfg.dataset_slice_end
        sliced = apply_slice and (start or end) and start >= 0 and end >= 0 and not (end and end <= start)
        try:
            if sliced:
                data = _normalize_parts(_slice_parts(parts, start, end), cfg, field_name)
            else:
                data = _merge(parts, results, field_name)
            problems += _usage_problems(data, cfg, field_name, _labels(parts))
        except DatasetError as exc:
            problems.append(exc)
    # the same file listed twice would repeat its problems word for word
    unique = dict.fromkeys((p.field, p.message) for p in problems)
    return [FieldError(f, message) for f, message in unique]


# ---------------------------------------------------------------------- uploads
UPLOAD_CHUNK = 1 << 20  # bytes copied at a time: an upload is never held twice in the server's memory


def save_upload(filename: str, data: bytes | BinaryIO, max_bytes: int = 200 * 2**20) -> Path:
    """Store an uploaded file under the datasets folder with a safe, content-addressed name.

    ``data`` is the upload itself (a file object, read in chunks while it is hashed and written) or bytes."""
    name = re.split(r"[\\/]", str(filename))[-1].strip()
    stem, dot, ext = name.rpartition(".")
    if not dot:
        stem, ext = name, ""
    suffix = f".{ext.lower()}" if ext else ""
    if suffix not in SUPPORTED_EXTENSIONS:
        raise DatasetError("local_datasets", f"{name or 'the file'}: unsupported file type '{suffix or '(none)'}'; "
                                             f"upload one of {', '.join(SUPPORTED_EXTENSIONS)}")
    stream = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data
    if stream.seekable():
        total = stream.seek(0, os.SEEK_END)
        stream.seek(0)
        if total > max_bytes:
            raise DatasetError("local_datasets", f"{name} is {total / 2**20:.1f} MiB; uploads are limited to "
                                                 f"{max_bytes / 2**20:.0f} MiB. Put larger files under the data root "
                                                 "and enter their path instead.")
    safe_stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._-")[:60] or "dataset"
    partial = paths.datasets_dir() / f".{safe_stem}{suffix}.{os.getpid()}.{secrets.token_hex(4)}.part"
    digest, size = hashlib.sha256(), 0
    try:
        with open(partial, "wb") as out:
            while chunk := stream.read(UPLOAD_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise DatasetError("local_datasets", f"{name} is over {max_bytes / 2**20:.0f} MiB; uploads are "
                                                         f"limited to {max_bytes / 2**20:.0f} MiB. Put larger files "
                                                         "under the data root and enter their path instead.")
                digest.update(chunk)
                out.write(chunk)
        if size == 0:
            raise DatasetError("local_datasets", f"{name} is empty")
        target = paths.datasets_dir() / f"{safe_stem}-{digest.hexdigest()[:10]}{suffix}"
        if target.is_file() and target.stat().st_size == size:
            return target  # the same content was uploaded before
        os.replace(partial, target)  # readers never see a half-written file
        return target
    finally:
        partial.unlink(missing_ok=True)


# ---------------------------------------------------------------------- hub (worker only)
_OFFLINE_ERROR_NAMES = {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectTimeout", "ReadTimeout",
                        "ConnectError", "NameResolutionError", "MaxRetryError"}


def load_hub(cfg: TrainConfig, split: str, apply_slice: bool | None = None) -> NormalizedData:
    """Load a split of ``cfg.hf_dataset`` and normalise it. Slices the training split unless told otherwise."""
    try:
        import datasets as hf_datasets  # worker only: importing it costs seconds and pulls in heavy libraries
    except ImportError as exc:
        raise DatasetError("hf_dataset", "hub datasets need the 'datasets' package: pip install datasets") from exc
    token = os.environ.get("HF_TOKEN") or None
    split_field = "train_split" if split == cfg.train_split else "eval_split"
    try:
        ds = hf_datasets.load_dataset(cfg.hf_dataset, cfg.subset or None, split=split, token=token)
    except Exception as exc:  # noqa: BLE001 - the hub raises many types; each becomes a field error the form shows
        raise _hub_error(exc, cfg, split, split_field, token) from None
    if apply_slice is None:
        apply_slice = split == cfg.train_split
    total = len(ds)
    if apply_slice and (cfg.dataset_slice_start or cfg.dataset_slice_end):
        stop = min(cfg.dataset_slice_end, total) if cfg.dataset_slice_end else total
        if cfg.dataset_slice_start >= stop:
            raise DatasetError("dataset_slice_start", f"the slice starts at row {cfg.dataset_slice_start}, but split "
                                                      f"'{split}' has only {total} rows")
        ds = ds.select(range(cfg.dataset_slice_start, stop))
    rows = ds.to_list()
    if not rows:
        raise DatasetError(split_field, f"split '{split}' of {cfg.hf_dataset} has no rows")
    data = normalize_rows(rows, cfg.format_type, cfg.custom_format_mapping, cfg.system_prompt, field_name="hf_dataset")
    problems = _usage_problems(data, cfg, "hf_dataset", cfg.hf_dataset)
    if problems:
        raise problems[0]
    return data


def _hub_error(exc: Exception, cfg: TrainConfig, split: str, split_field: str, token: str | None) -> DatasetError:
    detail = f"{type(exc).__name__}: {exc}"
    if token:
        detail = detail.replace(token, "***")
    chain, seen = [], exc
    while seen is not None and len(chain) < 10:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    names = {type(e).__name__ for e in chain}
    if names & _OFFLINE_ERROR_NAMES or any(isinstance(e, (ConnectionError, TimeoutError)) for e in chain):
        return DatasetError("hf_dataset", "could not reach the Hugging Face hub and the dataset is not in the local "
                                          f"cache: {detail}")
    if "DatasetNotFoundError" in names or "RepositoryNotFoundError" in names or "GatedRepoError" in names:
        return DatasetError("hf_dataset", f"{cfg.hf_dataset} was not found on the hub, or it is private/gated and "
                                          f"needs a Hugging Face token: {detail}")
    text = str(exc)
    if "Unknown split" in text or ("split" in text.lower() and "should be one of" in text.lower()):
        return DatasetError(split_field, f"{cfg.hf_dataset} has no split '{split}': {detail}")
    if "BuilderConfig" in text or "Config name is missing" in text:
        return DatasetError("subset", f"choose a valid subset of {cfg.hf_dataset}: {detail}")
    return DatasetError("hf_dataset", f"could not load {cfg.hf_dataset}: {detail}")


# ---------------------------------------------------------------------- what a run trains on
@dataclass
class TrainingData:
    """The normalised training data, and the rows a run trains and evaluates on after the eval split."""

    train: NormalizedData
    rows: list[dict]
    eval_rows: list[dict]


def load_for_training(cfg: TrainConfig) -> TrainingData:
    """Train and eval rows chosen exactly as a run chooses them: the preview and the worker share this.

    Hub split or local files; the eval set is a named split, separate files, or a fixed-seed held-out
    fraction of the training rows (only when no eval set was named). Imports ``datasets`` for hub data.
    """
    if cfg.hf_dataset:
        train = load_hub(cfg, cfg.train_split)
        evals = load_hub(cfg, cfg.eval_split).rows if cfg.eval_split else []
    else:
        train = load_local(cfg.local_datasets, cfg)
        evals = (load_local(cfg.local_eval_datasets, cfg, field_name="local_eval_datasets", apply_slice=False).rows
                 if cfg.local_eval_datasets else [])
    rows = train.rows
    if not evals and cfg.eval_fraction > 0:
        rows, evals = split_eval(train, cfg.eval_fraction, cfg.random_seed)
    return TrainingData(train=train, rows=rows, eval_rows=evals)


# ---------------------------------------------------------------------- eval split
def split_eval(data: NormalizedData, fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, eval): a fixed-seed held-out share of the rows, both in their original order."""
    rows = data.rows
    if fraction <= 0 or len(rows) < 2:
        return list(rows), []
    count = min(max(1, round(len(rows) * fraction)), len(rows) - 1)
    held = set(random.Random(seed).sample(range(len(rows)), count))
    return ([row for i, row in enumerate(rows) if i not in held],
            [row for i, row in enumerate(rows) if i in held])
