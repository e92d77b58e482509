"""Data-parallel training of one run through torchrun: ``python -m trainer_core.launch RUN_DIR``.

The orchestrator starts this instead of the worker when a run uses several processes
(``FINETUNE_STUDIO_NPROC``). It is torchrun itself (``torch.distributed.run``: the same argument parser and
elastic agent), given a single-host rendezvous and one ``trainer_core.worker`` per process; torchrun sets
RANK/LOCAL_RANK/WORLD_SIZE and the transformers Trainer picks DDP (NCCL on GPUs, gloo on CPU) from them.

What we add is the report when a rank fails: torchrun's agent watches every rank, stops the others when
one dies and raises ``ChildFailedError`` with each rank's exit; we name the rank that failed first, its
reason and the tail of its own log, as the run's error event (rank 0, which writes the other events, is
gone by then). Each rank's output is kept in ``ranks/`` and copied, prefixed ``[rankN]:``, into worker.log.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run as torchrun

from trainer_core import events as ev
from trainer_core import paths
from trainer_core.parallel import NPROC_ENV

RANK_LOG_LINES = 40


def torchrun_args(run_dir: Path, processes: int) -> list[str]:
    return ["--standalone", f"--nproc-per-node={processes}", "--max-restarts=0",
            "--monitor-interval=0.5",  # how soon the agent notices a dead rank
            f"--log-dir={run_dir / 'ranks'}", "--redirects=3", "--tee=3",
            "-m", "trainer_core.worker", str(run_dir)]


def rank_error_path(run_dir: Path, rank: int) -> Path:
    """Where a rank writes its own failure (message, type, traceback, time); read back by ``report_failure``."""
    return run_dir / "ranks" / f"rank-{rank}.error.json"


def rank_log_tail(run_dir: Path, rank: int, lines: int = RANK_LOG_LINES) -> str:
    """The last lines a rank wrote (stdout, then stderr), from torchrun's per-rank log files."""
    parts = []
    for stream in ("stdout.log", "stderr.log"):
        for path in sorted((run_dir / "ranks").glob(f"*/attempt_*/{rank}/{stream}")):
            text = path.read_text(errors="replace").splitlines()
            parts.extend(text[-lines:])
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


def report_failure(run_dir: Path, failures: dict, processes: int) -> str:
    rank, reason, exc_type = root_cause(failures, run_dir)
    tail = rank_log_tail(run_dir, rank)
    message = f"Rank {rank} of {processes} {reason}"
    # worker.log's tail becomes the run's log tail: end it with the failed rank's own last lines
    print(f"\n---- {message}\n---- last lines of rank {rank}:\n{tail}", flush=True)
    writer = ev.EventWriter(run_dir / "events.jsonl")
    writer.emit(ev.ErrorEvent(message=message, exc_type=exc_type, traceback=tail[-8000:]))
    writer.close()
    return message


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


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m trainer_core.launch RUN_DIR  (with FINETUNE_STUDIO_NPROC set)", file=sys.stderr)
        return 2
    run_dir = paths.resolve_inside(argv[1], [paths.runs_dir()])
    processes = int(os.environ.get(NPROC_ENV, "2"))
    try:
        torchrun(parse_args(torchrun_args(run_dir, processes)))
    except ChildFailedError as exc:  # process boundary: one rank failed and torchrun stopped the others
        report_failure(run_dir, exc.failures, processes)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
