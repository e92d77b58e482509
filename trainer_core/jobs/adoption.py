"""Who follows which job, and whether its worker still lives.

A worker outlives the server that started it (DESIGN rule 2). Every orchestrator (a dashboard, the CLI)
adopts the jobs the database says are active and nobody pumps: a per-run ``flock`` (``.pump.lock`` in the
run folder) makes sure only one follows a job. Liveness is the launcher's answer (trainer_core/launchers:
the local one asks the process handle when this process started the worker, else checks its pid against the
process start time, since pids are reused). The watchdog terminates, then kills, a worker that ignores
Stop/Cancel, through the same handle.
"""
from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path
from typing import IO, Callable, Iterator

import psutil

from db.entities import RunRecord
from db.store import Store
from trainer_core.export import staging as export_staging
from trainer_core.specs import checkpoints
from trainer_core.jobs.alerts import NO_STEP, Alert, AlertMonitor
from trainer_core.jobs.live import LiveRun
from trainer_core.jobs.pump import Tracker, set_terminal
from trainer_core.jobs.remote_view import RemoteView
from trainer_core.launchers import Launcher
from trainer_core.launchers.local import pid_alive, started_at  # noqa: F401 - started_at: callers' import
from trainer_core.protocol import control, paths
from trainer_core.protocol.status import JobKind, RunStatus

STOP_TIMEOUT_S = float(os.environ.get("FINETUNE_STUDIO_STOP_TIMEOUT", "120"))
KILL_GRACE_S = 10.0
# A training run that reports no new step for this long while its worker lives raises the no_step alert (a step,
# an in-training evaluation or a save may legitimately take minutes on a large model; a blocked one never ends).
STALL_S = float(os.environ.get("FINETUNE_STUDIO_STALL_MINUTES", "15")) * 60
PRESENCE_LOCK = ".orchestrators.lock"  # shared by every pumping orchestrator; `db rebuild` needs it exclusively
_OPEN_HOLDERS: set[str] = set()  # holder tokens of this process's orchestrators that are not closed


# ====================================================================== adopting
def orphans(store: Store, is_tracked: Callable[[str], bool], launcher: Launcher) -> Iterator[Tracker]:
    """Trackers for jobs that the database says are active but nobody in this process is pumping. A job
    whose folder is gone while its worker is dead is marked failed; one another process pumps is left to it."""
    for stale in store.active_runs():
        if is_tracked(stale.id):
            continue
        try:
            run_dir = paths.run_dir(stale.id)
        except paths.UnsafePathError:
            continue
        if not run_dir.is_dir():
            if launcher.adopt(stale).state().alive:
                continue  # its folder was deleted; whoever pumps it follows its open log (none: it fails at exit)
            store.finish_run(stale.id, RunStatus.FAILED,
                             error=f"The run folder {run_dir} is missing, so the run cannot be followed.")
            continue
        lock_fh = try_lock(run_dir)
        if lock_fh is None:
            continue  # another orchestrator (another server, the CLI) is pumping it
        run = store.get_run(stale.id)  # re-read under the lock: the owner may have just finished it
        if run is None or run.status.is_terminal():
            lock_fh.close()
            continue
        export_staging.remove_stale(run_dir)  # an export worker killed outright left its staging folder
        view = RemoteView(run, store)
        worker = launcher.adopt(run)
        tracked = Tracker(run.id, run_dir, view.live, run.event_offset, lock_fh, kind=run.kind, handle=worker,
                          pid=run.pid, pid_started_at=run.pid_started_at, best_eval_loss=run.best_eval_loss,
                          stop_requested_at=control.requested_at(run_dir), monitor=view.monitor,
                          losses=view.losses, sample_alerts=view.sample_alerts)
        state = worker.state()
        if not state.started:
            set_terminal(tracked, RunStatus.FAILED, error=f"The worker {state.reason}.")
        yield tracked


def rebuild_view(run: RunRecord, store: Store) -> tuple[LiveRun, AlertMonitor]:
    """Live state rebuilt from the database: the run's last known progress, metrics and alerts, and the
    alert monitor's state (the rules are deterministic: replaying the stored rows gives back exactly
    the alerts raised before, without storing them again)."""
    view = RemoteView(run, store)
    return view.live, view.monitor


# ====================================================================== liveness and the watchdog
def exited(t: Tracker) -> tuple[bool, str]:
    """Whether the job's worker has exited, and how (the launcher's answer)."""
    state = t.handle.state()
    return not state.alive, state.reason


def stopping_phase(action: control.Action) -> str:
    return "stopping (saving)" if action is control.Action.STOP else "cancelling"


def notice_request(t: Tracker) -> None:
    """A Stop or Cancel that another process made (the `stop` CLI, a second dashboard) reaches the worker through
    control.json only: whoever pumps the run enforces it like its own. Its live state says so, the row is set
    to stopping again at the next flush (a status event read while the request was made had set it back), and
    the watchdog's clock starts at the request's time. Costs one failed open() per tick and job without one."""
    if t.stop_requested_at is not None or t.terminal is not None:
        return
    action = control.read(t.run_dir)
    if action is None:
        return
    now = time.time()
    t.stop_requested_at = min(control.requested_at(t.run_dir) or now, now)  # never later than now: another
    # host's clock (a run folder on shared storage) must not postpone the timeout
    t.live.update(status=RunStatus.STOPPING, phase=stopping_phase(action))
    t.run_values.update(status=RunStatus.STOPPING.value, phase=stopping_phase(action))


def notice_stall(t: Tracker) -> None:
    """The heartbeat is a thread of its own, so a step blocked for ever (a reward that never returns) keeps a run
    "running" with a fresh heartbeat: raise the no_step alert once per stall, when a run training has shown no new
    step for STALL_S (by this process's clock: a worker's on another host may differ)."""
    if t.kind is not JobKind.TRAIN or t.terminal is not None or t.live.status is not RunStatus.RUNNING \
            or t.live.phase != "training":
        t.stall_step = None  # loading, saving, stopping: not a stalled step; the clock starts again in training
        return
    now, step = time.monotonic(), t.live.step
    if step != t.stall_step:
        t.stall_step, t.stall_since, t.stall_alerted = step, now, False
        return
    if t.stall_alerted or now - t.stall_since < STALL_S:
        return
    t.stall_alerted = True
    after = f"after step {step}" if step else "before the first step"
    alert = Alert(NO_STEP, step, f"No new step for {STALL_S / 60:g} minutes {after}, though the worker is alive: a "
                                 "step, an evaluation or a save is taking that long, or is blocked (a reward or data "
                                 "loader that never returns). Stop or Cancel ends it.")
    t.live.add_alert(alert)
    t.timeline.append((time.time(), "alert", alert.message))
    t.urgent = True


def watchdog(t: Tracker, store: Store) -> None:
    """Terminate, then kill, a worker that ignores Stop/Cancel for STOP_TIMEOUT_S."""
    if t.stop_requested_at is None or t.terminal is not None:
        return
    waited = time.time() - t.stop_requested_at
    if waited > STOP_TIMEOUT_S and t.terminated_at is None:
        t.terminated_at = time.time()
        t.handle.request_stop()
        store.add_event(t.run_id, "control", f"no response after {STOP_TIMEOUT_S:.0f}s: sent SIGTERM")
    elif t.terminated_at and time.time() - t.terminated_at > KILL_GRACE_S:
        t.handle.kill()


def clean_after_exit(t: Tracker, store: Store) -> None:
    """A training worker killed while saving (kill -9, the out-of-memory killer, a lost node) leaves a
    ``checkpoint-<step>`` it never finished and maybe a ``tmp-checkpoint-<step>``, which nothing else removes.
    Its process has exited, so no save is under way: remove them as its own Cancel would, and say so."""
    if t.kind is not JobKind.TRAIN:
        return
    try:
        removed = checkpoints.remove_partial_checkpoints(t.run_dir / "checkpoints", t.run_dir)
    except (OSError, paths.UnsafePathError) as exc:
        store.add_event(t.run_id, "warning", f"unfinished checkpoints were left in place: {exc}")
        return
    if removed:
        names = ", ".join(sorted(p.name for p in removed))
        store.add_event(t.run_id, "checkpoint", f"removed {names}: the worker ended while saving, so "
                                                f"{'it is' if len(removed) == 1 else 'they are'} incomplete")


# ====================================================================== locks
def try_lock(run_dir: Path) -> IO | None:
    """The run's pump lock, or None when another orchestrator holds it."""
    fh = open(run_dir / ".pump.lock", "w")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        return None
    return fh


def relock(t: Tracker) -> None:
    """The run folder was deleted (and maybe recreated): hold the pump lock in the folder that exists now,
    so no other orchestrator adopts the run while this one follows it."""
    if not t.run_dir.is_dir():
        return
    fresh = try_lock(t.run_dir)
    if fresh is not None:
        t.lock_fh.close()
        t.lock_fh = fresh


def hold_presence() -> IO:
    """A shared lock on the data root's presence file, held while an orchestrator pumps."""
    fh = open(paths.data_root() / PRESENCE_LOCK, "a")
    fcntl.flock(fh, fcntl.LOCK_SH)
    return fh


# ====================================================================== secret holders
def process_token() -> str:
    """This process, as other processes can recognise it: host, pid and start time (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{psutil.Process().create_time():.2f}"


def _parse_holder(token: str) -> tuple[str, int, float] | None:
    """(host, pid, process start time) of an orchestrator's holder token "host:pid:start:instance"."""
    parts = token.rsplit(":", 3)
    if len(parts) != 4:
        return None
    try:
        return parts[0], int(parts[1]), float(parts[2])
    except ValueError:
        return None


def holder_alive(token: str) -> bool:
    """Whether the orchestrator named by ``token`` may still launch its run: one of this process that is not
    closed, or one in another process that still runs. A process on another host cannot be checked: it is
    assumed alive (the run waits for it, or for someone to remove it from the queue)."""
    parsed = _parse_holder(token)
    if parsed is None:
        return False
    host, pid, started = parsed
    if host != socket.gethostname():
        return True
    if pid == os.getpid():
        return token in _OPEN_HOLDERS
    return pid_alive(pid, started)


def holder_gone(token: str) -> str:
    parsed = _parse_holder(token)
    if parsed is None:
        return "the dashboard or CLI that queued it is gone"
    if parsed[1] == os.getpid():
        return "the orchestrator that queued it and held the secret in memory was closed"
    return f"the process that queued it and held the secret in memory (pid {parsed[1]} on {parsed[0]}) has exited"


def open_holder(token: str) -> None:
    _OPEN_HOLDERS.add(token)


def close_holder(token: str) -> None:
    _OPEN_HOLDERS.discard(token)
