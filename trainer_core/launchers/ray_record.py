"""What a run folder records of its Ray job, as the pages show it (no ray import): the job (``ray_job.json``, by
the launcher), where each rank runs (``ray_ranks.json``, by rank 0 once the workers are placed:
trainer_core/worker/ray_entry.py) and the restarts after lost workers (``ray_restarts.jsonl``). The files live on
the shared storage, which a node writes: every value is read as untrusted text (a wrong type is dropped, text is
cut), and the Ray dashboard is linked only at an address this server may use."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from trainer_core.config import ray_address_problem
from trainer_core.protocol import files

PLACEMENT_FILE = "ray_ranks.json"
RESTARTS_FILE = "ray_restarts.jsonl"  # one line per restart of the workers: which rank and node were lost, when
RANKS_SHOWN = 256  # a placement file claiming more ranks is cut here
READ_MAX = 1 << 20  # bytes of a record file read
JOB_ID = re.compile(r"[A-Za-z0-9_.-]{1,200}")  # a submission id as the launcher makes them: safe in a URL


@dataclass(frozen=True)
class RankPlace:
    rank: int
    node_id: str
    address: str
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class RayRecord:
    job_id: str
    address: str  # as recorded (may carry a user and password: show it through ray.shown_address)
    dashboard: str  # the Ray dashboard's page of this job, "" when the address is not one this server may use
    ranks: tuple[RankPlace, ...]
    restarts: int


def read_record(run_dir: Path) -> RayRecord | None:
    """The run's Ray record, or None for a run that did not go to a Ray cluster."""
    from trainer_core.launchers.ray import shown_address

    job = _json(run_dir / "ray_job.json")
    if not isinstance(job, dict) or not isinstance(job.get("job_id"), str):
        return None
    address = job.get("address") if isinstance(job.get("address"), str) else ""
    job_id = job["job_id"][:200]
    usable = address.strip() and not ray_address_problem(address) and JOB_ID.fullmatch(job_id)
    dashboard = f"{shown_address(address).rstrip('/')}/#/jobs/{job_id}" if usable else ""
    return RayRecord(job_id, address[:500], dashboard, ranks_of(run_dir), restarts_of(run_dir))


def ranks_of(run_dir: Path) -> tuple[RankPlace, ...]:
    data = _json(run_dir / PLACEMENT_FILE)
    if not isinstance(data, list):
        return ()
    ranks = []
    for item in data[:RANKS_SHOWN]:
        if not isinstance(item, dict) or isinstance(item.get("rank"), bool) or not isinstance(item.get("rank"), int):
            continue
        gpus = item.get("gpus") if isinstance(item.get("gpus"), list) else []
        ranks.append(RankPlace(item["rank"], str(item.get("node_id", ""))[:64], str(item.get("address", ""))[:100],
                               tuple(str(g)[:16] for g in gpus[:16])))
    return tuple(ranks)


def restarts_of(run_dir: Path) -> int:
    try:
        return sum(1 for line in files.read_regular(run_dir / RESTARTS_FILE, READ_MAX).splitlines() if line.strip())
    except OSError:
        return 0


def _json(path: Path):
    try:
        return json.loads(files.read_regular(path, READ_MAX))
    except (OSError, ValueError, RecursionError):
        return None
