"""Data-parallel training of one run through torchrun: ``python -m trainer_core.worker.launch RUN_DIR``.

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

import os
import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run as torchrun

from trainer_core.protocol import events as ev, paths, secrets
from trainer_core.host.parallel import NPROC_ENV
from trainer_core.worker.bounded_log import BoundedOutput
from trainer_core.worker.ranks import rank_log_tail, root_cause


def torchrun_args(run_dir: Path, processes: int) -> list[str]:
    return ["--standalone", f"--nproc-per-node={processes}", "--max-restarts=0",
            "--monitor-interval=0.5",  # how soon the agent notices a dead rank
            f"--log-dir={run_dir / 'ranks'}", "--redirects=3", "--tee=3",
            "-m", "trainer_core.worker", str(run_dir)]


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


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m trainer_core.worker.launch RUN_DIR  (with FINETUNE_STUDIO_NPROC set)", file=sys.stderr)
        return 2
    run_dir = paths.resolve_inside(argv[1], [paths.runs_dir()])
    processes = int(os.environ.get(NPROC_ENV, "2"))
    # worker.log gets every rank's output (torchrun's tee): capped here, each rank's own file in its worker
    output = BoundedOutput([value for value in secrets.from_env(os.environ).values() if value])
    try:
        torchrun(parse_args(torchrun_args(run_dir, processes)))
    except ChildFailedError as exc:  # process boundary: one rank failed and torchrun stopped the others
        report_failure(run_dir, exc.failures, processes)
        return 1
    finally:
        output.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
