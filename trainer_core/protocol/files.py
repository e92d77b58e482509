"""Reading the end of a file that may be large (worker and rank logs): the one place that does it; and the last line
of a child process's output, its JSON reply."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

TAIL_BYTES = 64 * 1024  # enough for any number of log lines a page or an error message shows


def read_end(path: Path, max_bytes: int) -> str:
    """The last ``max_bytes`` of a file as text ("" when it does not exist; undecodable bytes replaced)."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def tail_lines(path: Path, lines: int, max_bytes: int = TAIL_BYTES) -> list[str]:
    """The last ``lines`` lines of a file, read from its end."""
    return read_end(path, max_bytes).splitlines()[-lines:] if lines > 0 else []


def last_json_line(text: str) -> Any:
    """A child process's reply: the last line of its output read as JSON (what it printed before is its log); None
    when there is no line or the last one is not JSON."""
    lines = text.strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None
