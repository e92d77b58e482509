"""People's data, durable like events (DESIGN rule 20): every vote, withdrawal, rating and removed rating is appended
to ``<data root>/feedback/log.jsonl`` as well as written to the database, so ``db rebuild`` restores them
(``read`` in order, replayed by the store) and a withdrawn vote stays withdrawn.

One JSON object per line: ``{"op": "vote"|"withdraw"|"rate"|"unrate", ...}``. Stdlib only.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trainer_core.protocol import journal, paths

LOG_FILE = "log.jsonl"
OPS = ("vote", "withdraw", "rate", "unrate")


def log_path() -> Path:
    folder = paths.data_root() / "feedback"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / LOG_FILE


def append(op: str, **data: Any) -> None:
    """Append one record; one write of one line in append mode, so two processes never interleave inside a line."""
    if op not in OPS:
        raise ValueError(f"unknown feedback op {op!r}")
    line = json.dumps({"op": op, **data}, sort_keys=True, ensure_ascii=False) + "\n"
    with open(log_path(), "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())  # a person's vote is not re-creatable: worth surviving a power loss


def read(path: Path | None = None) -> list[dict[str, Any]]:
    """The log's records in order; a torn or damaged line is skipped on its own (the others are kept)."""
    return [r for r in journal.read_objects(path or log_path()) if r.get("op") in OPS]
