"""Reading the end of a file that may be large (worker and rank logs): the one place that does it; and the last line
of a child process's output, its JSON reply."""
from __future__ import annotations

import json
import os
import stat
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


def read_regular(path: Path, max_chars: int) -> str:
    """The first ``max_chars`` of a regular file as text (undecodable bytes replaced); OSError for anything else.
    For files another host may have put in a run folder on the shared storage: opened non-blocking, so a named pipe
    in a file's place is refused at once instead of waiting for a writer (a page's rerun, the pump's adoption)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with open(fd, encoding="utf-8", errors="replace") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return fh.read(max_chars)


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
