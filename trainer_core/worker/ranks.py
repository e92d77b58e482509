"""When one rank of a data-parallel run fails: where each rank reports its own failure, which rank is
blamed (torchrun's survivors die of SIGTERM or a broken collective; neither is the cause), and the
tail of its own log. Used by the torchrun launcher (worker/launch.py) and by each rank (worker/train.py)."""
from __future__ import annotations

import json
import signal
from pathlib import Path

from trainer_core.protocol import files

RANK_LOG_LINES = 40


def rank_error_path(run_dir: Path, rank: int) -> Path:
    """Where a rank writes its own failure (message, type, traceback, time); read back by ``report_failure``."""
    return run_dir / "ranks" / f"rank-{rank}.error.json"


def rank_log_tail(run_dir: Path, rank: int, lines: int = RANK_LOG_LINES) -> str:
    """The last lines a rank wrote (stdout, then stderr), from torchrun's per-rank log files."""
    parts = []
    for stream in ("stdout.log", "stderr.log"):
        for path in sorted((run_dir / "ranks").glob(f"*/attempt_*/{rank}/{stream}")):
            parts.extend(files.tail_lines(path, lines))  # rank logs can be large: read from the end
    return "\n".join(parts[-lines:])


def root_cause(failures: dict, run_dir: Path) -> tuple[int, str, str]:
    """(rank, reason, exception type) of the rank that failed first.

    torchrun stops the surviving ranks with SIGTERM, and a rank whose peer vanished fails in its next
    collective; neither is the cause. So: a rank killed by any other signal first (the OOM killer, a
    segfault, kill -9), then the earliest error a rank reported itself, then any other exit code."""
    def describe(rank: int, failure) -> tuple[tuple, str, str]:
        own = _read_json(rank_error_path(run_dir, rank))
        if failure.exitcode < 0 and failure.exitcode != -signal.SIGTERM:
            name = _signal_name(-failure.exitcode)
            hint = " (often the out-of-memory killer)" if -failure.exitcode == signal.SIGKILL else ""
            return (0, 0.0, rank), f"was killed by {name}{hint}", "RankKilled"
        if own:
            return (1, float(own.get("ts", 0.0)), rank), f"failed: {own.get('message', '')}", own.get("exc_type", "")
        if failure.exitcode == -signal.SIGTERM:
            return (3, 0.0, rank), "was terminated (SIGTERM)", "RankTerminated"
        return (2, 0.0, rank), f"exited with code {failure.exitcode}", "RankFailed"

    described = sorted(describe(rank, failure) + (rank,) for rank, failure in failures.items())
    _, reason, exc_type, rank = described[0]
    return rank, reason, exc_type or "RankFailed"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
