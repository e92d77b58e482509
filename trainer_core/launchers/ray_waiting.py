"""A Ray job the cluster cannot place yet says so: ``waiting for the cluster: needs 4 GPUs, 2 free``.

The run stays STARTING (the status enum is closed); the wait is its phase, written to the run's events.jsonl as a
StatusEvent like any other phase, so Live, History, the CLI and ``db rebuild`` show it through the pump's own
handler, and a restarted dashboard reads it again from the log. When Ray places the work, a second StatusEvent
(``PLACED``) replaces it. Who writes it depends on what Ray holds back:

* a run of several workers: its Ray job's driver holds no resources and always starts; Ray Train's placement
  group for the workers is what waits. The driver (worker/ray_entry.py ``PlacementWatch``) watches its own
  job's placement groups, and answers a Stop or Cancel that arrives while they wait;
* a single-worker job (a one-process run, an eval, an export): the Ray job itself asks for the worker's CPU and
  GPUs, so while Ray cannot place it nothing of ours runs on the cluster. The dashboard's handle sees the job
  PENDING and writes the phase (``PendingJob``), and it answers a Stop or Cancel itself: it records the job
  cancelled and stops it on Ray.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Callable

from trainer_core.protocol import control, events as ev
from trainer_core.protocol.status import RunStatus

PREFIX = "waiting for the cluster"
PLACED = "placed on the cluster: starting the workers"
CHECK_EVERY_S = 3.0  # a pending job's shortfall is asked of the cluster at most this often
FIRST = ("GPU", "CPU")  # the order resources are named in; any other (custom) resource follows by name


def waiting_phase(per_worker: Mapping[str, float], workers: int, free: Mapping[str, float],
                  largest: Mapping[str, float] | None = None) -> str:
    """The phase of work Ray cannot place: what ``workers`` workers of ``per_worker`` each need in all against
    what the cluster has ``free``, for each resource that is short; ``largest``, the most of each resource one
    node has in total (None: unknown), names a worker no node can ever hold."""
    needs = {name: amount * workers for name, amount in per_worker.items() if amount}
    names = ordered(needs)
    short = [name for name in names if needs[name] > free.get(name, 0.0) + 1e-9]
    if short:
        detail = "; ".join(f"needs {count(needs[n], n)}, {number(free.get(n, 0.0))} free" for n in short)
    else:  # enough in all, but not where one worker fits (or Ray has not got to it yet)
        detail = "needs " + ", ".join(count(needs[n], n) for n in names) + ", free in all but not yet placed by Ray"
    too_big = [n for n in names if largest is not None and per_worker[n] > largest.get(n, 0.0) + 1e-9]
    if too_big:
        detail += "; no node has " + " and ".join(count(per_worker[n], n) for n in too_big) + " for one worker"
    return f"{PREFIX}: {detail}"


def ordered(names: Iterable[str]) -> list[str]:
    names = list(names)
    return [n for n in FIRST if n in names] + sorted(n for n in names if n not in FIRST)


def number(value: float) -> str:
    return f"{value:g}"


def count(value: float, name: str) -> str:
    """``4 GPUs``, ``1 CPU``, ``0.5 GPU``; a custom resource keeps its name as it is."""
    plural = "s" if name in FIRST and value > 1 else ""
    return f"{number(value)} {name}{plural}"


def largest_node(totals: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The most of each resource any one node has in total."""
    most: dict[str, float] = {}
    for node in totals:
        for name, amount in node.items():
            most[name] = max(most.get(name, 0.0), float(amount))
    return most


def append(run_dir: Path, event: ev.Event) -> int:
    """Append one event to the run's log; the log's size afterwards."""
    writer = ev.EventWriter(Path(run_dir) / ev.LOG_NAME)
    writer.emit(event)
    writer.close()
    return log_size(run_dir)


def log_size(run_dir: Path) -> int:
    try:
        return os.path.getsize(Path(run_dir) / ev.LOG_NAME)
    except OSError:
        return -1


class PendingJob:
    """The dashboard's side of a single-worker Ray job that Ray has not started (status PENDING): nothing of the
    job runs yet to say why, nor to read its control file, so the handle does both. ``usage`` answers the
    cluster's nodes as ``{node id: {resource: (free, total)}}`` ({} when it does not say)."""

    def __init__(self, run_dir: Path, usage: Callable[[], dict[str, dict[str, tuple[float, float]]]],
                 stop_job: Callable[[], None]):
        self.run_dir, self.usage, self.stop_job = Path(run_dir), usage, stop_job
        self.shown = ""  # the waiting phase this handle last wrote ("" none)
        self.written_size = -1  # the log's size just after that write
        self.checked_at = float("-inf")
        self.answered = False

    def follow(self, status: str, per_worker: Mapping[str, float]) -> bool:
        """Ray reports the job ``status``; ``per_worker``: what the job asked Ray for. True once a Stop or Cancel
        was answered: the job is over for the run, whatever Ray still says of it. The account of a wait is an
        extra: a failure to give it (the cluster's usage unreadable, the log's folder gone) is said on stderr and
        never stops the pump following the job."""
        try:
            if status == "PENDING":
                self.pending(per_worker)
            elif status == "RUNNING":
                self.started()
        except (OSError, ValueError, TypeError, KeyError) as exc:
            print(f"[finetune-studio] the wait of the Ray job in {self.run_dir} could not be followed: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return self.answered

    def pending(self, per_worker: Mapping[str, float]) -> None:
        """Ray holds the job PENDING: answer a Stop or Cancel, else say what it waits for (when short)."""
        if control.read(self.run_dir) is not None:
            self.answer_request()
            return
        if time.monotonic() - self.checked_at < CHECK_EVERY_S:
            return
        self.checked_at = time.monotonic()
        nodes = self.usage()
        if not nodes:
            return  # the cluster did not say what is free: nothing to claim
        free = {name: sum(n.get(name, (0.0, 0.0))[0] for n in nodes.values()) for name in per_worker}
        largest = largest_node({name: total for name, (_, total) in n.items()} for n in nodes.values())
        if all(free[n] >= a for n, a in per_worker.items()) and all(largest.get(n, 0) >= a for n, a in per_worker.items()
                                                                   if a):
            return  # room enough: it is starting (its runtime environment), not waiting
        phase = waiting_phase(per_worker, 1, free, largest)
        if phase != self.shown:
            self.written_size = append(self.run_dir, ev.StatusEvent(status=RunStatus.STARTING.value, phase=phase))
            self.shown = phase

    def started(self) -> None:
        """Ray started the job: the wait is over. Said only while the log is as this handle left it: once the
        worker has written its own status (it imports its libraries first, seconds), saying "starting" would
        take a running job back."""
        if self.shown and log_size(self.run_dir) == self.written_size:
            append(self.run_dir, ev.StatusEvent(status=RunStatus.STARTING.value, phase=PLACED))
        self.shown = ""

    def answer_request(self) -> None:
        """Stop & save or Cancel before the job started: nothing was trained or written, so the run ends
        cancelled at once (as a queued run does). Ray's stop_job reaches a job's supervisor, which Ray has not
        placed either: the request waits for it, and the job ends STOPPED as soon as Ray would start it (before
        it trains: its control file says Cancel too)."""
        if not self.answered:
            append(self.run_dir, ev.CompleteEvent(status=RunStatus.CANCELLED.value))
            self.stop_job()
            self.answered = True


NUMBER = r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"  # what float() reads: "1.2.3" is no number, not a crash
USAGE_LINE = re.compile(rf"^\s*{NUMBER}\s*/\s*{NUMBER}\s+(CPU|GPU)\s*$")  # "0.0/2.0 GPU" in Ray's usage text


def node_usage(address: str, timeout_s: float = 10.0) -> dict[str, dict[str, tuple[float, float]]]:
    """(free, total) CPUs and GPUs per node id, from the per-node usage Ray's dashboard shows on its Cluster page
    (``/nodes?view=summary``, lines such as ``1.0/2.0 GPU``: used/total, filled in once Ray's monitor has reported,
    a few seconds after a node joins); {} when it does not say. A resource a node's lines do not name is one it
    has none of."""
    try:
        with urllib.request.urlopen(f"{address.rstrip('/')}/nodes?view=summary", timeout=timeout_s) as reply:
            data = json.loads(reply.read())["data"]
        usage = data.get("nodeLogicalResources", data.get("node_logical_resources"))  # camelCased by Ray's REST
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    found: dict[str, dict[str, tuple[float, float]]] = {}
    for node_id, text in (usage.items() if isinstance(usage, dict) else ()):
        found[node_id] = {m[3]: (max(float(m[2]) - float(m[1]), 0.0), float(m[2]))
                          for m in map(USAGE_LINE.match, str(text).splitlines()) if m}
    return found
