"""Rules about runs that more than one page shares, kept out of the pages (which only lay them out):
which runs Resume is offered for, how many runs Compare takes, and what a run is called."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from trainer_core.protocol.status import RunStatus

# Runs compared at once: one run has nothing to compare with; past six the lines and colours blur together.
COMPARE_MIN, COMPARE_MAX = 2, 6


class NamedRun(Protocol):
    id: str
    name: str


def can_resume(status: RunStatus | str) -> bool:
    """Whether Resume is offered: the run ended without completing (stopped, failed or cancelled). The
    orchestrator's resume also needs a completed checkpoint and unchanged data, and says why when not."""
    status = RunStatus(status)
    return status.is_terminal() and status is not RunStatus.COMPLETED


def run_name(run: NamedRun) -> str:
    """What a run is called: its name, or its id when it has none."""
    return run.name or run.id


def run_labels(runs: Sequence[NamedRun]) -> dict[str, str]:
    """Run id -> a unique, readable label (the name; the id is added where names repeat)."""
    names = [run_name(r) for r in runs]
    return {r.id: name if names.count(name) == 1 else f"{name} · {r.id}" for r, name in zip(runs, names)}
