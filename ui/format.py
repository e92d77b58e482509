"""Display formatting for numbers, times and statuses. Missing values always read "—"."""
from __future__ import annotations

import math
import time
from datetime import datetime
from typing import Any

from trainer_core.protocol.status import JobKind, RunStatus
from trainer_core.views.run_rules import run_name

MISSING = "—"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def duration(seconds: float | None) -> str:
    """``3723`` -> ``"1h 02m 03s"``; under an hour ``"2m 03s"``; under a minute ``"45s"``."""
    if _missing(seconds) or seconds < 0:
        return MISSING
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def timestamp(ts: float | None) -> str:
    """UNIX seconds as local ``YYYY-MM-DD HH:MM:SS``."""
    if _missing(ts) or not ts:
        return MISSING
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def to_datetime(ts: float | None) -> datetime | None:
    return None if _missing(ts) or not ts else datetime.fromtimestamp(ts)


def number(value: float | int | None, digits: int = 4) -> str:
    """Integers with thousands separators, floats with ``digits`` significant digits."""
    if _missing(value):
        return MISSING
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) >= 1000):
        return f"{int(value):,}"
    return f"{value:.{digits}g}"


def scientific(value: float | None, digits: int = 2) -> str:
    """Learning rates: ``2e-4`` -> ``"2.00e-04"``."""
    return MISSING if _missing(value) else f"{value:.{digits}e}"


def compact(value: float | int | None) -> str:
    """Large counts: ``1234567`` -> ``"1.23M"``."""
    if _missing(value):
        return MISSING
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g}{unit}"
    return number(value)


def memory(mb: float | None) -> str:
    if _missing(mb):
        return MISSING
    return f"{mb / 1024:.2f} GB" if mb >= 1024 else f"{mb:.0f} MB"


def steps(done: int | None, total: int | None) -> str:
    if _missing(done):
        return MISSING
    return f"{done:,} / {total:,}" if total else f"{done:,}"


def status_badge(status: RunStatus | str, kind: JobKind = JobKind.TRAIN, phase: str = "") -> str:
    """Icon and label of a job's status, e.g. ``"✅ Completed"``, ``"🏃 Serving"``. A starting job's ``phase``
    follows (``"🚀 Starting · waiting for the cluster: needs 4 GPUs, 2 free"``): a start can take long for a
    reason worth a glance; other statuses say all there is."""
    try:
        status = RunStatus(status)
    except ValueError:
        return f"❔ {status}"
    text = f"{status.icon} {kind.status_label(status)}"
    return f"{text} · {phase}" if phase and status is RunStatus.STARTING else text


def run_choice(run) -> str:
    """A run in a picker: its name, status and creation time (History and Run details pick runs alike)."""
    return f"{run_name(run)} · {status_badge(run.status, run.kind)} · {timestamp(run.created_at)}"


def ago(ts: float | None, now: float | None = None) -> str:
    """Coarse age such as ``5m ago``, ``3h ago``, ``2d ago`` (fits a metric tile)."""
    if _missing(ts) or not ts:
        return MISSING
    seconds = max(0.0, (now or time.time()) - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return "just now"
