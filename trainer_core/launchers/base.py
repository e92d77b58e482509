"""The launcher interface: what the orchestrator and the pump may ask of a job's worker, wherever it runs.

A ``Launcher`` starts the worker of a run folder and returns a ``JobHandle``; after a server restart (or from
another process) ``adopt`` gives a handle again from what the store recorded at start (``JobHandle.record``).
Liveness is the handle's answer (``state``), never a look at the process table by the caller.

Stop-and-save and Cancel travel through the run folder's control file (DESIGN rule 4), which every launcher
shares: the run folder is on storage the worker sees. ``request_stop`` is the launcher's own channel for a
worker that does not answer the control file (locally SIGTERM, which the worker reads as Cancel), ``kill`` the
last resort that gives it no chance.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: the launchers never import the job specs or the store at run time
    from db.entities import RunRecord
    from trainer_core.config import TrainConfig
    from trainer_core.specs.jobspec import JobSpec


@dataclass(frozen=True)
class JobState:
    """Whether the worker still runs; when it does not, how it ended (``reason`` completes "The worker ...")."""

    alive: bool
    reason: str = ""
    started: bool = True  # False: the worker never started (nothing recorded to find it by)


ALIVE = JobState(alive=True)


class JobHandle(ABC):
    """One started worker as the server sees it."""

    #: This process started it, so its exit status will be known; False for an adopted worker, whose end the
    #: pump learns from its event log (the orchestrator does not wait for its exit then).
    started_here: bool = False
    #: The local process id when the worker is a process of this host (resource readings, /proc paths of its
    #: open log); None where the launcher has no local process.
    pid: int | None = None

    @abstractmethod
    def record(self) -> dict[str, Any]:
        """The run-table values that let ``Launcher.adopt`` find this worker again (stored at start)."""

    @abstractmethod
    def state(self) -> JobState:
        """Alive, or exited with the reason."""

    @abstractmethod
    def request_stop(self) -> None:
        """Ask the worker to end now, through the launcher (it may still write its last events)."""

    @abstractmethod
    def kill(self) -> None:
        """End the worker and everything it started, without a chance to clean up."""


class Launcher(ABC):
    """Starts workers and finds them again."""

    @abstractmethod
    def start(self, run_dir: Path, cfg: TrainConfig | JobSpec) -> JobHandle:
        """Start the worker of ``run_dir`` (raises OSError when it cannot be started)."""

    @abstractmethod
    def adopt(self, run: RunRecord) -> JobHandle:
        """A handle on the worker of a run started earlier (by a server before its restart, or by another
        process), from the values ``JobHandle.record`` gave at its start."""
