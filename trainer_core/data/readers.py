"""Rows out of .jsonl/.json/.csv/.parquet files (or a folder of them), each problem a field error
that says where in the file it is and how to fix it."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from trainer_core.data.bounded_cache import BoundedCache
from trainer_core.data import DatasetError, quoted
from trainer_core.data.sources import SUPPORTED_EXTENSIONS, source_files

_CACHE_SIZE = 4  # parsed files kept in memory ...
_CACHE_BYTES = 128 * 2**20  # ... up to this much file size: a 50 MB JSONL is ~300 MB of Python objects
_CSV_FIELD_LIMIT = 64 * 2**20  # the csv module's default (128 KiB per cell) rejects long documents

# keyed by (path, mtime, size), weighed by the file size
_read_cache: BoundedCache[tuple[str, int, int], list[dict]] = BoundedCache(
    _CACHE_SIZE, max_weight=_CACHE_BYTES, weight=lambda key, rows: key[2])


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
    cached = _read_cache.get(key)
    if cached is not None:
        return cached
    rows = _parse(path, suffix, field_name)
    if not rows:
        raise DatasetError(field_name, f"{path.name} has no rows")
    _read_cache.put(key, rows)
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
        return parse_jsonl(text, path.name, field_name)
    if suffix == ".json":
        return _parse_json(text, path.name, field_name)
    return _parse_csv(text, path.name, field_name)


_TOO_DEEP = ("nests lists or objects too deeply to read (hundreds of levels, such as [[[...]]]); a row is an "
             "object of text fields or a list of chat turns: fix the file")


def parse_jsonl(text: str, name: str, field_name: str) -> list[dict]:
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
            return parse_jsonl(text, name, field_name)
        raise DatasetError(field_name, f"{name} is not valid JSON: {exc.msg} at line {exc.lineno} "
                                       f"column {exc.colno}") from None
    if isinstance(data, dict):
        lists = [key for key, value in data.items() if isinstance(value, list)]
        if len(lists) == 1 and lists[0] not in ("messages", "conversations"):
            data = data[lists[0]]
        elif lists and set(lists) <= {"messages", "conversations"}:
            data = [data]  # a single conversation
        else:
            keys = quoted(list(data))[:200]
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
