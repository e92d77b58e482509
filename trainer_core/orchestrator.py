"""The orchestrator: owns the run lifecycle. One per server (cached with st.cache_resource), also
driven by the CLI. It never imports the ML stack.

* ``start`` validates the config, writes the run folder (config.yaml without secrets), records the run
  and spawns ``python -m trainer_core.worker RUN_DIR`` in its own session, so the worker outlives
  the page and the server. Secrets travel in the worker's environment only.
* A pump thread tails every active run's ``events.jsonl`` from the offset saved in the database,
  feeds the in-memory live state, and writes metrics in batches together with the new offset.
* Runs left active by an earlier server are adopted: live workers are followed again, dead ones are
  marked failed with what is known. A per-run ``flock`` makes sure only one orchestrator pumps a run.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import secrets as pysecrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterable

import pandas as pd
import psutil

from db.models import Run, RunEvent
from db.store import SPARKLINE_POINTS, MetricBuffer, Store
from trainer_core import checkpoints, control, datasets, paths, scheduling
from trainer_core.alerts import AlertMonitor
from trainer_core.resources import ResourceSample, ResourceSampler
from trainer_core import events as ev
from trainer_core.config import ConfigError, FieldError, TrainConfig, looks_like_path
from trainer_core.live import LiveRun, LiveSnapshot, metric_row, thin
from trainer_core.remote_view import RemoteView, lineage_frame, seed_lineage
from trainer_core.status import RunStatus

POLL_S = 0.25
ADOPT_EVERY_S = 2.0
PUMP_READS_PER_TICK = 4  # chunks of the event log per run and tick, so one busy run cannot starve the others
QUEUE_EVERY_S = 1.0  # queued runs also start when a run ended in another orchestrator (another server, the CLI)
STOP_TIMEOUT_S = float(os.environ.get("FINETUNE_STUDIO_STOP_TIMEOUT", "120"))
KILL_GRACE_S = 10.0
LOG_TAIL_LINES = 60
IDLE_FLUSH_S = 5.0  # heartbeats during model loading or a long eval still reach the database
LIVE_KEEP = 20  # finished runs kept in memory for snapshots; older ones are rebuilt from the database
REMOTE_KEEP = 20  # views of runs pumped by other processes, refreshed incrementally from the database
HISTORY_PAGE = 50


class RunRefused(RuntimeError):
    """A run that cannot be started or resumed, with the reason (e.g. no usable checkpoint)."""


@dataclass
class _Tracked:
    """Pump-side bookkeeping of one active run."""

    run_id: str
    run_dir: Path
    live: LiveRun
    offset: int
    lock_fh: IO
    proc: subprocess.Popen | None = None
    pid: int | None = None
    pid_started_at: float | None = None
    buffer: MetricBuffer = field(default_factory=MetricBuffer)
    timeline: list = field(default_factory=list)
    run_values: dict = field(default_factory=dict)
    urgent: bool = False
    terminal: tuple[RunStatus, dict] | None = None
    stop_requested_at: float | None = None
    terminated_at: float | None = None
    best_eval_loss: float | None = None
    flushed_at: float = field(default_factory=time.monotonic)
    monitor: AlertMonitor = field(default_factory=AlertMonitor)
    log: ev.LogFollower | None = None  # reads events.jsonl through its own descriptor (see LogFollower)
    losses: dict = field(default_factory=dict)  # step -> train loss of this run: its History sparkline
    sparkline_stale: bool = False

    def __post_init__(self) -> None:
        if self.log is None:
            self.log = ev.LogFollower(self.run_dir / ev.LOG_NAME, self.pid)


class Orchestrator:
    def __init__(self, store: Store | None = None, start_pump: bool = True):
        self.store = store or Store()
        self._lock = threading.RLock()
        self._tracked: dict[str, _Tracked] = {}
        self._finished: dict[str, LiveRun] = {}
        self._finished_order: deque[str] = deque()
        self._remote: OrderedDict[str, RemoteView] = OrderedDict()
        self._closing = threading.Event()
        self._last_adopt = 0.0
        self._last_queue_check = 0.0
        self._secrets: dict[str, dict[str, str]] = {}  # secrets of queued runs, in memory only
        self._sampler = ResourceSampler()
        self._thread: threading.Thread | None = None
        self._adopt_orphans()
        if start_pump:
            self._thread = threading.Thread(target=self._pump_forever, name="studio-pump", daemon=True)
            self._thread.start()

    # ================================================================== public API
    def validate(self, cfg: TrainConfig) -> list[FieldError]:
        return cfg.validate()

    def start(self, cfg: TrainConfig, parent: Run | None = None, resumed_from_step: int | None = None) -> str:
        """Record a run and start it now, or queue it when its devices are busy. Returns the run id.

        Queued runs start by themselves (also after a server restart) when the runs before them end."""
        errors = cfg.validate()
        if errors:
            raise ConfigError(errors)
        cfg = with_absolute_paths(cfg)
        fingerprint = scheduling.data_fingerprint(cfg)
        devices = scheduling.devices_of(cfg)
        # An OS-enforced lock: two sessions (or two orchestrators after a hot reload, or the CLI next
        # to the dashboard) pressing Start together can never both see the same devices as free.
        with self._start_lock():
            run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + pysecrets.token_hex(3)
            run_dir = paths.run_dir(run_id)
            run_dir.mkdir(parents=True)
            (run_dir / "config.yaml").write_text(cfg.to_yaml())
            name = cfg.run_name or f"{cfg.method_label} · {run_id[9:15]}"
            queue = [(r.id, r.devices) for r in self.store.queued_runs()]
            now_free = scheduling.startable(queue + [(run_id, devices)],
                                            [r.devices for r in self.store.active_runs()])
            run = Run(id=run_id, name=name, status=RunStatus.QUEUED.value, phase="waiting in the queue",
                      model=cfg.model_label, dataset=cfg.dataset_label, method=cfg.method_label,
                      created_at=time.time(), output_dir=str(run_dir), total_steps=cfg.max_steps,
                      config_json=_json(cfg.to_public_dict()), devices=devices, data_fingerprint=fingerprint,
                      queue_position=self.store.next_queue_position(), needs_secrets=",".join(cfg.secrets()),
                      parent_run_id=parent.id if parent else None, resumed_from_step=resumed_from_step)
            lock_fh = None
            if run_id in now_free:
                run.status, run.phase, run.queue_position = RunStatus.STARTING.value, "launching worker", None
                run.started_at = time.time()
                lock_fh = _try_lock(run_dir)  # held before the row exists, so no other pump adopts it
            elif cfg.secrets():
                self._secrets[run_id] = cfg.secrets()  # memory only: secrets never reach the disk
            self.store.create_run(run)
            if parent is not None:
                self.store.add_event(run_id, "resume", f"resumed from run '{parent.name}' at step {resumed_from_step}")
            if lock_fh is not None:
                self._launch(run, cfg, lock_fh)
        return run_id

    def resume(self, run_id: str, secrets: dict[str, str] | None = None) -> str:
        """Start a new run that continues ``run_id`` from its latest completed checkpoint.

        Raises RunRefused with the reason when there is nothing usable to resume from."""
        old = self.store.get_run(run_id)
        if old is None:
            raise RunRefused(f"There is no run {run_id}.")
        status = RunStatus(old.status)
        if not status.is_terminal():
            raise RunRefused(f"Run '{old.name}' is still {status.label.lower()}; resume it once it has ended.")
        if status is RunStatus.COMPLETED:
            raise RunRefused(f"Run '{old.name}' completed; there is nothing left to resume. Start a new run "
                             "with more steps instead.")
        run_dir = paths.run_dir(run_id)
        checkpoint = checkpoints.latest_checkpoint(run_dir / "checkpoints")
        if checkpoint is None:
            raise RunRefused(f"Run '{old.name}' has no completed checkpoint to resume from (it saves one on "
                             "Stop & save, or every save_steps steps).")
        try:
            cfg = TrainConfig.from_yaml((run_dir / "config.yaml").read_text())
        except (OSError, ConfigError) as exc:
            raise RunRefused(f"The saved config of run '{old.name}' cannot be read: {exc}") from None
        try:
            fingerprint = scheduling.data_fingerprint(cfg)
        except datasets.DatasetError as exc:
            raise RunRefused(f"The training data of run '{old.name}' is no longer readable ({exc}).") from None
        if old.data_fingerprint and fingerprint != old.data_fingerprint:
            raise RunRefused(f"The training data of run '{old.name}' changed since it ran ({cfg.dataset_label}); "
                             "resuming would mix two datasets. Start a new run instead.")
        needed = [n for n in old.needs_secrets.split(",") if n]
        values = _secret_values(needed, secrets)
        missing = [n for n in needed if not values.get(n)]
        if missing:
            raise RunRefused(f"Run '{old.name}' used {', '.join(missing)}, which is never stored: enter it again "
                             "to resume (or set HF_TOKEN / WANDB_API_KEY in the dashboard's environment).")
        step = int(checkpoint.name.rsplit("-", 1)[1])
        base = (old.name or old.id)[:60].rstrip()
        cfg = dataclasses.replace(cfg, resume_from_checkpoint=str(checkpoint), run_name=f"{base} (resumed)", **values)
        return self.start(cfg, parent=old, resumed_from_step=step)

    def resources(self, run_id: str) -> ResourceSample | None:
        """CPU/RAM of the run's worker process tree and the host's GPUs; None when it is not running."""
        run = self.store.get_run(run_id)
        if run is None or RunStatus(run.status).is_terminal() or not _pid_alive(run.pid, run.pid_started_at):
            return None
        return self._sampler.sample(run.pid)

    def alert_counts(self, run_ids: list[str]) -> dict[str, int]:
        return self.store.event_counts(run_ids, "alert")

    def delete_run(self, run_id: str, delete_files: bool = False) -> None:
        """Remove a finished run from History and, when asked, its folder (only ever inside the runs root).

        Refused with RunRefused while the run is queued or active."""
        run = self.store.get_run(run_id)
        if run is None:
            raise RunRefused(f"There is no run {run_id}.")
        if not RunStatus(run.status).is_terminal():
            raise RunRefused(f"Run '{run.name}' is {RunStatus(run.status).label.lower()}: stop it, or remove it from "
                             "the queue, before deleting it.")
        folder = paths.run_dir(run_id)  # refuses ids that would leave the runs root
        self.store.delete_run(run_id)
        with self._lock:
            self._finished.pop(run_id, None)
            self._remote.pop(run_id, None)
        if delete_files and folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)  # rmtree unlinks symlinks inside the tree instead of following them

    def queue(self) -> list[Run]:
        return self.store.queued_runs()

    def move_in_queue(self, run_id: str, offset: int) -> bool:
        with self._start_lock():
            return self.store.move_in_queue(run_id, offset)

    def remove_from_queue(self, run_id: str) -> None:
        """Take a queued run out of the queue (it stays in History as cancelled)."""
        self._request(run_id, control.Action.CANCEL)

    def stop(self, run_id: str) -> None:
        """Stop & save: the worker ends at the next step and saves a checkpoint and the adapter."""
        self._request(run_id, control.Action.STOP)

    def cancel(self, run_id: str) -> None:
        """Cancel: the worker ends at the next step without saving."""
        self._request(run_id, control.Action.CANCEL)

    def active_run_id(self) -> str | None:
        with self._lock:
            for run_id, tracked in self._tracked.items():
                if tracked.terminal is None:
                    return run_id
        active = self.store.active_runs()
        return active[0].id if active else None

    def snapshot(self, run_id: str) -> LiveSnapshot | None:
        with self._lock:
            tracked = self._tracked.get(run_id)
            live = tracked.live if tracked else self._finished.get(run_id)
        if live is not None:
            return live.snapshot()
        return self._remote_snapshot(run_id)

    def list_runs(self, limit: int = HISTORY_PAGE, offset: int = 0, search: str = "") -> list[Run]:
        """A page of runs, newest first (without their config and log tail: use get_run for those)."""
        return self.store.list_runs(limit=limit, offset=offset, search=search)

    def count_runs(self, search: str = "") -> int:
        return self.store.count_runs(search)

    def get_run(self, run_id: str) -> Run | None:
        return self.store.get_run(run_id)

    def get_runs(self, run_ids: list[str]) -> list[Run]:
        """The runs with these ids that exist, in the order asked for (any run, however old)."""
        return self.store.get_runs(run_ids)

    def metrics(self, run_id: str, lineage: bool = False, columns: Iterable[str] | None = None) -> pd.DataFrame:
        """A run's metrics; with ``lineage``, preceded by those of the runs it resumed from; ``columns``: only
        ``step`` and these metric fields."""
        if not lineage:
            return self.store.metrics_frame(run_id, columns=columns)
        earlier, own = self.metrics_parts(run_id)
        frame = pd.concat([earlier, own], ignore_index=True) if len(earlier) else own
        if columns is None:
            return frame
        wanted = {"step", *columns}
        return frame[[c for c in frame.columns if c in wanted]]

    def metrics_parts(self, run_id: str, columns: Iterable[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(metrics of the runs it resumed from, its own metrics): one read each; ``columns``: only ``step``
        and these metric fields."""
        own = self.store.metrics_frame(run_id, columns=columns)
        run = self.store.get_run(run_id)
        if run is None or not run.parent_run_id:
            return own.iloc[:0], own
        earlier = lineage_frame(self.store, run)
        return (earlier if columns is None else earlier[[c for c in own.columns if c in earlier]]), own

    def events(self, run_id: str) -> list[RunEvent]:
        return self.store.get_events(run_id)

    def loss_series(self, run_ids: list[str]) -> dict[str, list[float]]:
        return self.store.loss_series(run_ids)

    def sparklines(self, runs: list[Run]) -> dict[str, list[float]]:
        """History's loss sparklines, stored with the runs (computed once for runs recorded before)."""
        return self.store.sparklines(runs)

    def run_config(self, run_id: str) -> dict[str, Any]:
        run = self.store.get_run(run_id)
        if run is None:
            return {}
        return json.loads(run.config_json or "{}")

    def log_tail(self, run_id: str, lines: int = LOG_TAIL_LINES) -> str:
        try:
            return _tail(paths.run_dir(run_id) / "worker.log", lines)
        except paths.UnsafePathError:
            return ""

    def log_text(self, run_id: str, max_bytes: int = 8 << 20) -> str:
        """The worker log (its last ``max_bytes`` when longer), for download and filtering."""
        try:
            path = paths.run_dir(run_id) / "worker.log"
            with open(path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - max_bytes))
                return fh.read().decode("utf-8", errors="replace")
        except (paths.UnsafePathError, FileNotFoundError):
            return ""

    def wait(self, run_id: str, timeout: float | None = None, on_tick: Callable[[LiveSnapshot], None] | None = None,
             interval: float = 0.5) -> LiveSnapshot:
        """Block until the run is terminal in the database (used by the CLI and tests)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if on_tick:  # a snapshot of a run pumped elsewhere is rebuilt from the database: only when shown
                snap = self.snapshot(run_id)
                if snap:
                    on_tick(snap)
            run = self.store.get_run(run_id)
            if run is not None and RunStatus(run.status).is_terminal() and not self._is_tracked(run_id):
                return self.snapshot(run_id)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} still {run.status if run else 'missing'} after {timeout}s")
            time.sleep(interval)

    def close(self) -> None:
        """Stop pumping (workers keep running; another orchestrator can adopt them)."""
        self._closing.set()
        if self._thread:
            self._thread.join(timeout=5)
        with self._lock:
            tracked = list(self._tracked.values())
        for item in tracked:
            self._flush(item)
            if item.terminal is not None:
                self._finish(item)  # its terminal line is behind the saved offset: settle it now
            else:
                item.lock_fh.close()
                item.log.close()
        with self._lock:
            self._tracked.clear()

    # ================================================================== spawning
    def _start_lock(self):
        return _FileLock(paths.data_root() / ".start.lock")

    def _launch(self, run: Run, cfg: TrainConfig, lock_fh: IO) -> None:
        """Spawn the worker of a run just marked STARTING, holding its pump lock. Call with the start lock held."""
        run_dir = paths.run_dir(run.id)
        try:
            proc = self._spawn(run_dir, cfg)
        except OSError as exc:
            self.store.finish_run(run.id, RunStatus.FAILED, error=f"could not start the worker: {exc}")
            lock_fh.close()
            raise
        try:
            pid_started = psutil.Process(proc.pid).create_time()
        except psutil.NoSuchProcess:
            pid_started = None  # it died at once; the pump reports its exit code and log
        self.store.update_run(run.id, pid=proc.pid, pid_started_at=pid_started)
        live = LiveRun(run.id, run.name, RunStatus.STARTING, phase="launching worker", model=run.model,
                       dataset=run.dataset, method=run.method, started_at=run.started_at,
                       total_steps=cfg.max_steps, output_dir=str(run_dir))
        seed_lineage(live, run, self.store)
        with self._lock:
            self._tracked[run.id] = _Tracked(run.id, run_dir, live, 0, lock_fh, proc=proc, pid=proc.pid,
                                             pid_started_at=pid_started)

    def launch_queued(self) -> list[str]:
        """Start every queued run whose devices are free (any orchestrator may do it; the lock makes it once)."""
        self._last_queue_check = time.monotonic()
        if not self.store.queued_runs():
            return []
        launched = []
        with self._start_lock():
            queue = self.store.queued_runs()  # re-read under the lock
            free = set(scheduling.startable([(r.id, r.devices) for r in queue],
                                            [r.devices for r in self.store.active_runs()]))
            for run in queue:
                if run.id in free and self._launch_queued(run):
                    launched.append(run.id)
        return launched

    def _launch_queued(self, run: Run) -> bool:
        run_dir = paths.run_dir(run.id)
        try:
            cfg = TrainConfig.from_yaml((run_dir / "config.yaml").read_text())
        except (OSError, ConfigError) as exc:
            self.store.finish_run(run.id, RunStatus.FAILED, error=f"its saved config cannot be read: {exc}")
            return False
        needed = [name for name in run.needs_secrets.split(",") if name]
        cfg = dataclasses.replace(cfg, **_secret_values(needed, self._secrets.get(run.id)))
        missing = [name for name in needed if not getattr(cfg, name)]
        if missing:
            self.store.finish_run(run.id, RunStatus.FAILED, error=(
                f"This run was queued with {', '.join(missing)}, which is never written to disk, and the dashboard "
                "restarted before it started. Start it again and enter the secret, or set HF_TOKEN / WANDB_API_KEY "
                "in the dashboard's environment."))
            return False
        errors = cfg.validate()  # files may have changed or gone while it waited
        if errors:
            self.store.finish_run(run.id, RunStatus.FAILED, error="Invalid when its turn came: " +
                                  "; ".join(str(e) for e in errors))
            return False
        lock_fh = _try_lock(run_dir)
        if lock_fh is None:
            return False  # another orchestrator holds it (it cannot be launching it: we hold the start lock)
        started = time.time()
        self.store.update_run(run.id, status=RunStatus.STARTING.value, phase="launching worker",
                              started_at=started, queue_position=None)
        self.store.add_event(run.id, "status", "Starting: left the queue")
        self._secrets.pop(run.id, None)
        run.started_at = started
        self._launch(run, cfg, lock_fh)
        return True

    def _spawn(self, run_dir: Path, cfg: TrainConfig) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "WANDB_API_KEY")}
        env.update(PYTHONUNBUFFERED="1", FINETUNE_STUDIO_HOME=str(paths.data_root()),
                   TOKENIZERS_PARALLELISM="false", HF_HUB_DISABLE_PROGRESS_BARS="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                          env.get("PYTHONPATH", "")]))
        if cfg.hf_token:
            env["HF_TOKEN"] = cfg.hf_token
        if cfg.wandb_token:
            env["WANDB_API_KEY"] = cfg.wandb_token
        if cfg.gpu_ids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in cfg.gpu_ids)
        with open(run_dir / "worker.log", "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "trainer_core.worker", str(run_dir)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True,  # own session: Ctrl-C or a restart of the server does not reach it
                close_fds=True)

    # ================================================================== control
    def _request(self, run_id: str, action: control.Action) -> None:
        run = self.store.get_run(run_id)
        if run is None or RunStatus(run.status).is_terminal():
            return
        if run.status == RunStatus.QUEUED.value:
            with self._start_lock():  # the queue may be launching it right now: decide under its lock
                run = self.store.get_run(run_id)
                if run is not None and run.status == RunStatus.QUEUED.value:
                    self._secrets.pop(run_id, None)
                    self.store.finish_run(run_id, RunStatus.CANCELLED, phase="removed from the queue",
                                          queue_position=None)
                    return
        run_dir = paths.run_dir(run_id)
        recreated = not run_dir.is_dir()
        if recreated:
            # The folder was deleted while the worker runs: it still reads control.json at this path.
            run_dir.mkdir(parents=True)
            self.store.add_event(run_id, "warning", f"the run folder {run_dir} was missing: recreated it so the "
                                                    "worker finds the request")
        control.request(run_dir, action)
        with self._lock:
            tracked = self._tracked.get(run_id)
            if tracked is not None:
                if recreated:
                    self._relock(tracked)
                tracked.stop_requested_at = tracked.stop_requested_at or time.time()
                tracked.live.update(status=RunStatus.STOPPING,
                                    phase="stopping (saving)" if action is control.Action.STOP else "cancelling")
        self.store.update_run(run_id, status=RunStatus.STOPPING.value,
                              phase="stopping (saving)" if action is control.Action.STOP else "cancelling")
        self.store.add_event(run_id, "control", f"{action.value} requested")

    # ================================================================== pump
    def _pump_forever(self) -> None:
        while not self._closing.is_set():
            try:
                self.pump_once()
            except Exception as exc:  # noqa: BLE001 - the pump must survive a bad tick; it retries next tick
                print(f"[finetune-studio] pump error: {type(exc).__name__}: {exc}", file=sys.stderr)
            self._closing.wait(POLL_S)

    def pump_once(self) -> None:
        if time.monotonic() - self._last_adopt > ADOPT_EVERY_S:
            self._adopt_orphans()
        with self._lock:
            tracked = list(self._tracked.values())
        finished = sum(self._pump_run(item) for item in tracked)
        if finished or time.monotonic() - self._last_queue_check > QUEUE_EVERY_S:
            self.launch_queued()

    def _pump_run(self, t: _Tracked) -> bool:
        """Read new events of one run; True when the run finished in this call."""
        if not (t.run_dir / ".pump.lock").exists():
            self._relock(t)
        self._drain(t, max_reads=PUMP_READS_PER_TICK)
        exited, exit_desc = self._exited(t)
        if t.terminal is None and exited:
            # Read everything the worker wrote before exiting, then decide: after a restart the backlog
            # of a run that finished while nobody pumped it can be many reads long.
            self._drain(t, max_reads=None)
            if t.terminal is None:
                # A server stopped between storing the offset past the final event and settling the run
                # (the worker was still tearing down): the outcome is already in the log, behind the offset.
                final = t.log.last_terminal_event()
                if final is not None:
                    _HANDLERS[final.kind](self, t, final)
            if t.terminal is None:
                error = f"The worker {exit_desc} before finishing."
                tail = _tail(t.run_dir / "worker.log", LOG_TAIL_LINES)
                if t.stop_requested_at and t.terminated_at:
                    error = f"The worker did not stop within {STOP_TIMEOUT_S:.0f}s and was terminated ({exit_desc})."
                self._set_terminal(t, RunStatus.FAILED, error=error, log_tail=tail)
        self._watchdog(t)
        idle_updates = (t.run_values or t.timeline) and time.monotonic() - t.flushed_at > IDLE_FLUSH_S
        if t.urgent or t.buffer.due() or t.terminal is not None or idle_updates:
            self._flush(t)
        if t.terminal is not None and (exited or t.proc is None):
            self._finish(t)
            return True
        return False

    def _drain(self, t: _Tracked, max_reads: int | None) -> None:
        """Handle the log's new lines, up to ``max_reads`` chunks (None: until it has nothing new). Each
        line is handled before the offset moves past it, and a batch that is due (by count or age) is
        stored between two lines, so a long backlog reaches the database as it is read."""
        reads = 0
        while max_reads is None or reads < max_reads:
            lines = t.log.read(t.offset)
            reads += 1
            if not lines:
                return
            for line in lines:
                if line.event is not None:
                    _HANDLERS[line.event.kind](self, t, line.event)
                elif line.problem:
                    _on_log_problem(t, line.problem)
                t.offset = line.end
                if t.buffer.due():
                    self._flush(t)  # the offset saved with these rows is right after the line just handled

    def _relock(self, t: _Tracked) -> None:
        """The run folder was deleted (and maybe recreated): hold the pump lock in the folder that exists now,
        so no other orchestrator adopts the run while this one follows it."""
        if not t.run_dir.is_dir():
            return
        fresh = _try_lock(t.run_dir)
        if fresh is not None:
            t.lock_fh.close()
            t.lock_fh = fresh

    def _flush(self, t: _Tracked) -> None:
        if t.sparkline_stale:
            t.run_values["sparkline"] = json.dumps(thin(list(t.losses.values()), SPARKLINE_POINTS))
            t.sparkline_stale = False
        rows = t.buffer.take()
        self.store.append_metrics(t.run_id, rows, event_offset=t.offset, events=t.timeline, **t.run_values)
        t.timeline, t.run_values, t.urgent = [], {}, False
        t.flushed_at = time.monotonic()

    def _finish(self, t: _Tracked) -> None:
        status, values = t.terminal
        self.store.finish_run(t.run_id, status, **values)
        t.live.update(status=status, finished_at=time.time(), **{k: v for k, v in values.items()
                                                                  if k in ("error", "log_tail", "output_dir")})
        with self._lock:
            self._tracked.pop(t.run_id, None)
            self._finished[t.run_id] = t.live
            self._finished_order.append(t.run_id)
            while len(self._finished_order) > LIVE_KEEP:
                self._finished.pop(self._finished_order.popleft(), None)
        t.lock_fh.close()
        t.log.close()

    def _set_terminal(self, t: _Tracked, status: RunStatus, **values: Any) -> None:
        if t.terminal is None:
            t.terminal = (status, values)
            t.live.update(status=status, **{k: v for k, v in values.items() if k in ("error", "log_tail")})

    def _exited(self, t: _Tracked) -> tuple[bool, str]:
        if t.proc is not None:
            code = t.proc.poll()
            if code is None:
                return False, ""
            return True, _describe_exit(code)
        if _pid_alive(t.pid, t.pid_started_at):
            return False, ""
        return True, "process disappeared (it was started by an earlier dashboard; exit code unknown)"

    def _watchdog(self, t: _Tracked) -> None:
        """Terminate, then kill, a worker that ignores Stop/Cancel for STOP_TIMEOUT_S."""
        if t.stop_requested_at is None or t.terminal is not None:
            return
        waited = time.time() - t.stop_requested_at
        if waited > STOP_TIMEOUT_S and t.terminated_at is None:
            t.terminated_at = time.time()
            _signal_group(t.pid, signal.SIGTERM)
            t.timeline.append((time.time(), "control", f"no response after {STOP_TIMEOUT_S:.0f}s: sent SIGTERM"))
        elif t.terminated_at and time.time() - t.terminated_at > KILL_GRACE_S:
            _signal_group(t.pid, signal.SIGKILL)

    # ================================================================== adoption
    def _adopt_orphans(self) -> None:
        """Follow runs that the database says are active but nobody in this process is pumping."""
        self._last_adopt = time.monotonic()
        for stale in self.store.active_runs():
            with self._lock:
                if stale.id in self._tracked:
                    continue
            try:
                run_dir = paths.run_dir(stale.id)
            except paths.UnsafePathError:
                continue
            if not run_dir.is_dir():
                if _pid_alive(stale.pid, stale.pid_started_at):
                    continue  # its folder was deleted; whoever pumps it follows its open log (none: it fails at exit)
                self.store.finish_run(stale.id, RunStatus.FAILED,
                                      error=f"The run folder {run_dir} is missing, so the run cannot be followed.")
                continue
            lock_fh = _try_lock(run_dir)
            if lock_fh is None:
                continue  # another orchestrator (another server, the CLI) is pumping it
            run = self.store.get_run(stale.id)  # re-read under the lock: the owner may have just finished it
            if run is None or RunStatus(run.status).is_terminal():
                lock_fh.close()
                continue
            view = RemoteView(run, self.store)
            tracked = _Tracked(run.id, run_dir, view.live, run.event_offset, lock_fh, pid=run.pid,
                               pid_started_at=run.pid_started_at, best_eval_loss=run.best_eval_loss,
                               stop_requested_at=control.requested_at(run_dir), monitor=view.monitor,
                               losses=view.losses)
            if run.pid is None:
                self._set_terminal(tracked, RunStatus.FAILED, error="The worker never started (no process id recorded).")
            with self._lock:
                self._tracked[run.id] = tracked
                self._remote.pop(run.id, None)

    def _is_tracked(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self._tracked

    def _remote_snapshot(self, run_id: str) -> LiveSnapshot | None:
        """A run this process does not pump: its view is built once, then only new rows are read."""
        run = self.store.get_run(run_id)
        with self._lock:
            view = self._remote.get(run_id)
            if run is None:
                self._remote.pop(run_id, None)
                return None
            if view is not None:
                self._remote.move_to_end(run_id)
        if view is None:
            view = RemoteView(run, self.store)  # outside the lock: the first build reads every row
            with self._lock:
                self._remote[run_id] = view
                while len(self._remote) > REMOTE_KEEP:
                    self._remote.popitem(last=False)
        else:
            view.refresh(run)
        return view.live.snapshot()


def _rebuild(run: Run, store: Store) -> tuple[LiveRun, AlertMonitor]:
    """Live state rebuilt from the database: the run's last known progress, metrics and alerts, and the
    alert monitor's state (the rules are deterministic: replaying the stored rows gives back exactly
    the alerts raised before, without storing them again)."""
    view = RemoteView(run, store)
    return view.live, view.monitor


# ====================================================================== event handlers
def _on_status(orch: Orchestrator, t: _Tracked, e: ev.StatusEvent) -> None:
    status = RunStatus(e.status)
    if t.live.status is RunStatus.STOPPING and status in (RunStatus.STARTING, RunStatus.RUNNING):
        status = RunStatus.STOPPING  # a stop was requested; don't flip back to running in the UI
    t.live.update(status=status, phase=e.phase, **({"engine": e.engine} if e.engine else {}))
    t.run_values.update(status=status.value, phase=e.phase, **({"engine": e.engine} if e.engine else {}))
    t.timeline.append((e.ts, "status", f"{status.label}: {e.phase}" if e.phase else status.label))
    t.urgent = True


def _on_warning(orch: Orchestrator, t: _Tracked, e: ev.WarningEvent) -> None:
    t.live.add_warning(e.message)
    t.timeline.append((e.ts, "warning", e.message))
    t.urgent = True


def _on_progress(orch: Orchestrator, t: _Tracked, e: ev.ProgressEvent) -> None:
    row = metric_row(e)
    t.buffer.add(row)
    t.live.add_metric(row)
    t.live.update(step=e.step, total_steps=e.total_steps, epoch=e.epoch, loss=e.loss, learning_rate=e.learning_rate,
                  grad_norm=e.grad_norm, tokens_seen=e.tokens_seen, tokens_per_s=e.tokens_per_s,
                  memory_mb=e.memory_mb, eta_s=e.eta_s)
    t.run_values.update(steps_done=e.step, total_steps=e.total_steps, epoch=e.epoch, last_loss=e.loss,
                        tokens_seen=e.tokens_seen, heartbeat_at=e.ts)
    if e.loss is not None:
        t.losses[e.step] = e.loss
        t.sparkline_stale = True
    _check_alerts(t, row, e.ts)


def _check_alerts(t: _Tracked, row: dict[str, Any], ts: float) -> None:
    """Alerts go to the live view and, with the next flush, to the run's timeline in the database."""
    for alert in t.monitor.observe(row):
        t.live.add_alert(alert)
        t.timeline.append((ts, "alert", alert.message))
        t.urgent = True


def _on_eval(orch: Orchestrator, t: _Tracked, e: ev.EvalEvent) -> None:
    row = metric_row(e)
    t.buffer.add(row)
    t.live.add_metric(row)
    _check_alerts(t, row, e.ts)
    t.live.update(eval_loss=e.eval_loss)
    if e.eval_loss is not None and (t.best_eval_loss is None or e.eval_loss < t.best_eval_loss):
        t.best_eval_loss = e.eval_loss
        t.run_values["best_eval_loss"] = e.eval_loss


def _on_checkpoint(orch: Orchestrator, t: _Tracked, e: ev.CheckpointEvent) -> None:
    t.timeline.append((e.ts, "checkpoint", f"checkpoint saved at step {e.step}: {e.path}"))
    t.urgent = True


def _on_complete(orch: Orchestrator, t: _Tracked, e: ev.CompleteEvent) -> None:
    values: dict[str, Any] = {"final_loss": e.final_loss}
    if e.steps:
        values["steps_done"] = e.steps
    if e.output_dir:
        values["output_dir"] = e.output_dir
    orch._set_terminal(t, RunStatus(e.status), **values)


def _on_error(orch: Orchestrator, t: _Tracked, e: ev.ErrorEvent) -> None:
    orch._set_terminal(t, RunStatus.FAILED, error=e.message,
                       log_tail=_tail(t.run_dir / "worker.log", LOG_TAIL_LINES))


def _on_heartbeat(orch: Orchestrator, t: _Tracked, e: ev.HeartbeatEvent) -> None:
    t.run_values["heartbeat_at"] = e.ts


def _on_log_problem(t: _Tracked, problem: str) -> None:
    """An invalid line (skipped on its own) or a change to the log file itself: a warning in the timeline."""
    t.live.add_warning(problem)
    t.timeline.append((time.time(), "warning", problem))
    t.urgent = True


_HANDLERS: dict[str, Callable[[Orchestrator, _Tracked, Any], None]] = {
    "status": _on_status, "warning": _on_warning, "progress": _on_progress, "eval": _on_eval,
    "checkpoint": _on_checkpoint, "complete": _on_complete, "error": _on_error, "heartbeat": _on_heartbeat,
}


# ====================================================================== helpers
def with_absolute_paths(cfg: TrainConfig) -> TrainConfig:
    """Pin relative dataset/model paths to absolute ones, so the worker and a later resume read the
    same files whatever directory they run in."""
    def pin(sources: list[str], field_name: str) -> list[str]:
        return [s if s.startswith("bundled:") else str(datasets.resolve_source(s, field_name)) for s in sources]

    model = cfg.model_name
    if looks_like_path(model):
        model = str(Path(model).expanduser().resolve())
    return dataclasses.replace(cfg, model_name=model,
                               local_datasets=pin(cfg.local_datasets, "local_datasets"),
                               local_eval_datasets=pin(cfg.local_eval_datasets, "local_eval_datasets"))


class _FileLock:
    """An exclusive ``flock`` on a file for a ``with`` block (the OS releases it if the process dies)."""

    def __init__(self, path: Path):
        self.path = path
        self._fh: IO | None = None

    def __enter__(self) -> "_FileLock":
        self._fh = open(self.path, "w")
        fcntl.flock(self._fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._fh is not None
        self._fh.close()  # closing releases the lock
        self._fh = None


def _secret_values(names: list[str], given: dict[str, str] | None) -> dict[str, str]:
    """Values of the secret fields ``names`` for a run that starts later: the ones given (kept in
    memory while it was queued, or typed again), else the server's environment."""
    given = given or {}
    env = {"hf_token": os.environ.get("HF_TOKEN", ""), "wandb_token": os.environ.get("WANDB_API_KEY", "")}
    return {name: given.get(name) or env.get(name, "") for name in names if name in env}


def _try_lock(run_dir: Path) -> IO | None:
    fh = open(run_dir / ".pump.lock", "w")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        return None
    return fh


def _pid_alive(pid: int | None, started_at: float | None) -> bool:
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if started_at and abs(proc.create_time() - started_at) > 1.0:
            return False  # the pid was reused by another process
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _signal_group(pid: int | None, sig: signal.Signals) -> None:
    if not pid:
        return
    try:
        os.killpg(pid, sig)  # the worker leads its own session/process group
    except (ProcessLookupError, PermissionError):
        pass


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (often the out-of-memory killer)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {code}"


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def _json(data: dict) -> str:
    return json.dumps(data, sort_keys=True)
