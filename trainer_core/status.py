"""The closed set of run states. Display text is derived from it, never parsed back."""
from __future__ import annotations

from enum import Enum


class RunStatus(str, Enum):
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
