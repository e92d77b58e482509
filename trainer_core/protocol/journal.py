"""The orchestrator's half of a run's durable record: ``runs/<id>/journal.jsonl``.

``events.jsonl`` holds what the worker reported; everything else the database knows about a run (its
row as created, the process id, queue moves, Stop requests, the final outcome the orchestrator decided,
a deletion from History) is appended here by the store as it writes it. The two logs together are the
truth; the database is a cache that ``db rebuild`` (trainer_core.jobs.rebuild) restores from them.

One JSON object per line: ``{"op": "create"|"update"|"event"|"finish"|"delete", ...}``. Stdlib only.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trainer_core.protocol import paths

JOURNAL_FILE = "journal.jsonl"


def append(run_id: str, op: str, **data: Any) -> None:
    """Append one record to the run's journal; a run without a folder (a bare store in tests) has none."""
    try:
        folder = paths.run_dir(run_id)
    except paths.UnsafePathError:
        return
    if not folder.is_dir():
        return
    line = json.dumps({"op": op, **data}, sort_keys=True, default=_plain) + "\n"
    # One write of one line in append mode: two processes appending never interleave inside a line.
    with open(folder / JOURNAL_FILE, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())  # rare writes (a handful per run): worth surviving a power loss


def read(run_dir: Path) -> list[dict[str, Any]]:
    """The journal's records in order; a torn line (a crash mid-write) is skipped, and so is a line that is not
    JSON, on its own: one damaged byte (invalid UTF-8 is replaced, line by line) never costs the other records."""
    return [r for r in read_objects(Path(run_dir) / JOURNAL_FILE) if isinstance(r.get("op"), str)]


def read_objects(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of an append-only log, line by line, in order ([] without the file): a torn or damaged line
    is skipped on its own. The journal and the feedback log read through it."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    records = []
    for raw in data.split(b"\n"):
        try:
            record = json.loads(raw.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def deleted(run_dir: Path) -> bool:
    """Whether the run was deleted from History (its folder was kept)."""
    return any(r["op"] == "delete" for r in read(run_dir))


def _plain(value: Any) -> Any:
    return getattr(value, "value", str(value))  # enums (RunStatus) as their value
