"""The closed set of run states. Display text is derived from it, never parsed back."""
from __future__ import annotations

from dataclasses import dataclass
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
    the worker log and RunStatus; what is its own is its row of ``JOB_KINDS`` below."""

    TRAIN = "train"
    SERVE = "serve"
    EVAL = "eval"
    EXPORT = "export"
    RECIPE = "recipe"

    @property
    def label(self) -> str:
        return JOB_KINDS[self].label

    def status_label(self, status: RunStatus) -> str:
        """A status as people read it for a job of this kind: a running server is "Serving", not "Training"."""
        if status is RunStatus.RUNNING:
            return JOB_KINDS[self].running
        return status.label


@dataclass(frozen=True)
class JobKindEntry:
    """A kind of job, as every layer needs it: the one table of job kinds. A new kind is its modules (settings, worker
    entry point, pump handlers for its own events, page) and one row of ``JOB_KINDS``; tests/jobs/test_job_kinds.py
    checks every row against the modules it names. Dotted paths, imported where they are used (the worker imports
    only its entry point; the dashboard never imports a worker module)."""

    label: str  # History's Kind column
    running: str  # its status while it runs ("Serving", not "Training")
    worker: str  # the module whose main(run_dir) -> int runs it: python -m trainer_core.worker RUN_DIR picks it
    settings: str  # the module of its settings (a JobSpec subclass registered for the kind; training: TrainConfig)
    events: tuple[str, ...]  # its own events besides the lifecycle ones; each has a handler in trainer_core.jobs.pump


JOB_KINDS: dict[JobKind, JobKindEntry] = {
    JobKind.TRAIN: JobKindEntry("Training", "Training", "trainer_core.worker.train", "trainer_core.config",
                                ("progress", "eval", "checkpoint", "sample", "data")),
    JobKind.SERVE: JobKindEntry("Serving", "Serving", "trainer_core.worker.serve", "trainer_core.serving.spec",
                                ("serve_ready",)),
    JobKind.EVAL: JobKindEntry("Evaluation", "Evaluating", "trainer_core.worker.evaluate",
                               "trainer_core.evaluation.spec", ("progress", "eval_sample", "eval_result")),
    JobKind.EXPORT: JobKindEntry("Export", "Exporting", "trainer_core.worker.export", "trainer_core.export.spec",
                                 ("progress", "artifact", "verify")),
    JobKind.RECIPE: JobKindEntry("Data recipe", "Generating", "trainer_core.worker.recipe", "trainer_core.recipes.spec",
                                 ("progress", "artifact")),
}


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
