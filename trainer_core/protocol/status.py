"""The closed set of run states. Display text is derived from it, never parsed back."""
from __future__ import annotations

from enum import StrEnum
from pathlib import Path


class RunStatus(StrEnum):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    COMPLETED = "completed"
    STOPPED = "stopped"
    CANCELLED = "cancelled"
    FAILED = "failed"

    def is_terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def label(self) -> str:
        return _LABELS[self]

    @property
    def icon(self) -> str:
        return _ICONS[self]


_TERMINAL = frozenset({RunStatus.COMPLETED, RunStatus.STOPPED, RunStatus.CANCELLED, RunStatus.FAILED})

_LABELS = {
    RunStatus.QUEUED: "Queued",
    RunStatus.STARTING: "Starting",
    RunStatus.RUNNING: "Training",
    RunStatus.STOPPING: "Stopping",
    RunStatus.COMPLETED: "Completed",
    RunStatus.STOPPED: "Stopped (saved)",
    RunStatus.CANCELLED: "Cancelled",
    RunStatus.FAILED: "Failed",
}

_ICONS = {
    RunStatus.QUEUED: "⏳",
    RunStatus.STARTING: "🚀",
    RunStatus.RUNNING: "🏃",
    RunStatus.STOPPING: "🛑",
    RunStatus.COMPLETED: "✅",
    RunStatus.STOPPED: "💾",
    RunStatus.CANCELLED: "✖️",
    RunStatus.FAILED: "❌",
}


class JobKind(StrEnum):
    """What a job does. Every kind shares the queue, device reservations, the event log, the control file,
    the worker log and RunStatus; each has its own worker entry point (trainer_core.worker.ENTRY_POINTS),
    its own event handlers (trainer_core.jobs.pump) and its own page."""

    TRAIN = "train"
    SERVE = "serve"
    EVAL = "eval"
    EXPORT = "export"

    @property
    def label(self) -> str:
        return _KIND_LABELS[self]

    def status_label(self, status: RunStatus) -> str:
        """A status as people read it for a job of this kind: a running server is "Serving", not "Training"."""
        if status is RunStatus.RUNNING:
            return _RUNNING_LABELS[self]
        return status.label


_RUNNING_LABELS = {"train": "Training", "serve": "Serving", "eval": "Evaluating", "export": "Exporting"}
_KIND_LABELS = {JobKind.TRAIN: "Training", JobKind.SERVE: "Serving", JobKind.EVAL: "Evaluation",
                JobKind.EXPORT: "Export"}


KIND_FILE = "kind.txt"  # in the run folder; a folder without one (recorded before kinds existed) is a train job


def read_kind(run_dir: Path) -> JobKind:
    """The kind of the job whose folder is ``run_dir``. ValueError names the file and the known kinds."""
    try:
        text = (Path(run_dir) / KIND_FILE).read_text().strip()
    except FileNotFoundError:
        return JobKind.TRAIN
    try:
        return JobKind(text)
    except ValueError:
        known = ", ".join(k.value for k in JobKind)
        raise ValueError(f"{Path(run_dir) / KIND_FILE} names the job kind {text[:40]!r}; known kinds: {known}") from None


def write_kind(run_dir: Path, kind: JobKind) -> None:
    (Path(run_dir) / KIND_FILE).write_text(kind.value + "\n")
