"""The orchestrator: the one API over the job lifecycle. One per server (cached with st.cache_resource, built
when the server starts), also driven by the CLI. It never imports the ML stack.

It composes the rest of trainer_core/jobs/:
* ``start``/``resume`` validate the config, write the run folder (config.yaml without secrets, kind.txt),
  record the job and start it now through the ``launcher`` (trainer_core/launchers; launcher.py: the local one
  with the job's environment) or queue it (queue.py);
* a pump thread follows every active job's ``events.jsonl`` (pump.py) into the live state (live.py) and the
  database, and starts queued jobs whose devices became free;
* jobs left active by an earlier server are adopted, dead workers are marked failed, and a worker that
  ignores Stop/Cancel is terminated (adoption.py).
"""
from __future__ import annotations

import dataclasses
import json
import secrets as pysecrets
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable, Iterable

import pandas as pd

from db.entities import ArtifactRecord, EvalResultRecord, EventRecord, RunRecord, SampleRecord
from db.store import Store
from trainer_core import access, checkpoints, jobspec
from trainer_core.bounded_cache import BoundedCache
from trainer_core.config import ConfigError, FieldError, TrainConfig, looks_like_path
from trainer_core.data import DatasetError, loading
from trainer_core.data.fingerprint import data_fingerprint
from trainer_core.data.sources import resolve_source
from trainer_core.methods import grpo
from trainer_core.rewards import files as reward_files
from trainer_core.rewards import spec as reward_spec
from trainer_core.jobs import adoption, evals, pump, queue, resource_check
from trainer_core.jobs.launcher import PlacingLauncher, cluster_devices, launcher_problems
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.jobspec import JobSpec
from trainer_core.jobs.live import LiveRun, LiveSnapshot
from trainer_core.jobs.remote_view import RemoteViews, lineage_frame, seed_lineage
from trainer_core.jobs.resources import ResourceSample, ResourceSampler
from trainer_core.launchers import Launcher
from trainer_core.protocol import control, files, paths
from trainer_core.protocol.secrets import ENV_NAMES as SECRET_ENV_NAMES
from trainer_core.protocol.status import JobKind, RunStatus, write_kind
from trainer_core.serving import endpoint as endpoint_file
from trainer_core.serving import spec as serve_spec

POLL_S = 0.25
ADOPT_EVERY_S = 2.0
QUEUE_EVERY_S = 1.0  # queued runs also start when a run ended in another orchestrator (another server, the CLI)
LIVE_KEEP = 20  # finished runs kept in memory for snapshots; older ones are rebuilt from the database
REMOTE_KEEP = 20  # views of runs pumped by other processes, refreshed incrementally from the database
HISTORY_PAGE = 50


class RunRefused(RuntimeError):
    """A run that cannot be started or resumed, with the reason (e.g. no usable checkpoint)."""


class Orchestrator:
    def __init__(self, store: Store | None = None, start_pump: bool = True, launcher: Launcher | None = None):
        self.store = store or Store()
        self.launcher = launcher or PlacingLauncher()
        self._lock = threading.RLock()
        self._tracked: dict[str, pump.Tracker] = {}
        self._finished: BoundedCache[str, LiveRun] = BoundedCache(LIVE_KEEP)
        self._remote = RemoteViews(self.store, REMOTE_KEEP)  # runs pumped by another process
        self._closing = threading.Event()
        self._last_adopt = 0.0
        self._last_queue_check = 0.0
        self._secrets: dict[str, dict[str, str]] = {}  # secrets of queued runs, in memory only
        self._server_keys: dict[str, str] = {}  # API keys of the playground servers it started, memory only
        # Names this orchestrator in the rows of runs whose secrets only it holds: other orchestrators (the
        # CLI, another server, a hot reload's second one) leave those runs to it while it is open.
        self.holder = f"{adoption.process_token()}:{pysecrets.token_hex(4)}"
        adoption.open_holder(self.holder)
        self._sampler = ResourceSampler()
        self._thread: threading.Thread | None = None
        # A pumping orchestrator writes to the database at any time: while one runs (a dashboard, the CLI),
        # `db rebuild` must not move the database away under it. Waits while a rebuild runs.
        self._presence = adoption.hold_presence() if start_pump else None
        self._adopt_orphans()
        if start_pump:
            self._thread = threading.Thread(target=self._pump_forever, name="studio-pump", daemon=True)
            self._thread.start()

    # ================================================================== public API
    def validate(self, cfg: TrainConfig) -> list[FieldError]:
        """Every field problem; when the fields are fine, whether the device can plausibly hold the run."""
        return (cfg.validate() + loading.check_data(cfg) + launcher_problems(cfg)) or resource_check.memory_problems(cfg)

    def start(self, cfg: TrainConfig, parent: RunRecord | None = None, resumed_from_step: int | None = None,
              actor: access.Actor | None = None) -> str:
        """Record a run and start it now, or queue it when its devices are busy. Returns the run id.

        Queued runs start by themselves (also after a server restart) when the runs before them end.
        ``actor`` (the pages and the CLI always give one) must be allowed to start runs and owns the run."""
        _authorize(actor, access.Action.START, "")
        rewards = grpo.rewards_of(cfg) if cfg.method == "grpo" else []
        if actor is not None and actor.role is not access.Role.ADMIN and reward_spec.needs_admin(rewards):
            raise RunRefused("Not allowed: a custom Python reward runs its code on this host, so only an admin may "
                             "start a run with one; use the built-in rewards, or ask an admin to start it.")
        errors = self.validate(cfg)
        if errors:
            raise ConfigError(errors)
        cfg = with_absolute_paths(cfg)
        name = cfg.run_name or f"{cfg.method_label} · {{stamp}}"
        row = dict(model=cfg.model_label, dataset=cfg.dataset_label, method=cfg.method_label,
                   total_steps=cfg.max_steps, config_json=_json(cfg.to_public_dict()),
                   data_fingerprint=data_fingerprint(cfg), needs_secrets=tuple(cfg.secrets()),
                   parent_run_id=parent.id if parent else None, resumed_from_step=resumed_from_step,
                   steps_done=resumed_from_step or 0)
        run_id = self._record(JobKind.TRAIN, cfg, name, row, actor,
                              lambda run_dir: _write_train_job(run_dir, cfg, rewards),
                              note=(f"resumed from run '{parent.name}' at step {resumed_from_step}" + _by(actor))
                              if parent is not None else "")
        return run_id

    def submit(self, spec: JobSpec, actor: access.Actor | None = None) -> str:
        """Record a job of a kind other than training (serve, eval, export) and start it now, or queue it
        when its devices are busy, exactly like ``start``. Returns the job id; ConfigError lists every
        problem of the spec."""
        _authorize(actor, access.Action.START, "")
        if actor is not None and actor.role is not access.Role.ADMIN and spec.admin_only():
            raise RunRefused("Not allowed: " + "; ".join(spec.admin_only()))
        errors = spec.validate()
        if errors:
            raise ConfigError(errors)
        label = spec.KIND.label
        row = dict(model=spec.model_label, dataset=spec.dataset_label, method=label, total_steps=spec.total_steps,
                   config_json=_json(spec.to_dict()), data_fingerprint="", needs_secrets=(),
                   parent_run_id=spec.source.run_id or None)
        return self._record(spec.KIND, spec, spec.name or f"{label} · {{stamp}}", row, actor,
                            lambda run_dir: jobspec.write_spec(run_dir, spec))

    def _record(self, kind: JobKind, job: TrainConfig | JobSpec, name: str, row: dict[str, Any],
                actor: access.Actor | None, write: Callable[[Path], None], note: str = "") -> str:
        """Write the job folder, create its row, and launch it now or leave it queued."""
        devices = cluster_devices(job) or queue.devices_of(job)
        with queue.start_lock():
            run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + pysecrets.token_hex(3)
            run_dir = paths.run_dir(run_id)
            run_dir.mkdir(parents=True)
            write(run_dir)
            write_kind(run_dir, kind)
            if actor is not None:  # the database is a cache of the run folder: who started it lives there too
                (run_dir / "owner.txt").write_text(actor.name + "\n")
            waiting = [(r.id, r.devices) for r in self.store.queued_runs()]
            now_free = queue.startable(waiting + [(run_id, devices)], [r.devices for r in self.store.active_runs()])
            run = RunRecord(id=run_id, name=name.replace("{stamp}", run_id[9:15]), status=RunStatus.QUEUED,
                            kind=kind, phase="waiting in the queue", created_at=time.time(), output_dir=str(run_dir),
                            devices=devices, queue_position=self.store.next_queue_position(),
                            owner=actor.name if actor else "", **row)
            lock_fh = None
            if run_id in now_free:
                run = run.replace(status=RunStatus.STARTING, phase="launching worker", queue_position=None,
                                  started_at=time.time())
                lock_fh = adoption.try_lock(run_dir)  # held before the row exists, so no other pump adopts it
            elif job.secrets():
                self._secrets[run_id] = job.secrets()  # memory only: secrets never reach the disk
                run = run.replace(secrets_holder=self.holder)  # so other orchestrators leave this run to us
            self.store.create_run(run)
            if note:
                self.store.add_event(run_id, "resume", note)
            if lock_fh is not None:
                self._launch(run, job, lock_fh)
        return run_id

    def resume(self, run_id: str, secrets: dict[str, str] | None = None, actor: access.Actor | None = None) -> str:
        """Start a new run that continues ``run_id`` from its latest completed checkpoint.

        Raises RunRefused with the reason when there is nothing usable to resume from."""
        old = self.store.get_run(run_id)
        if old is None:
            raise RunRefused(f"There is no run {run_id}.")
        _authorize(actor, access.Action.RESUME, old.owner)
        status = old.status
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
            fingerprint = data_fingerprint(cfg)
        except DatasetError as exc:
            raise RunRefused(f"The training data of run '{old.name}' is no longer readable ({exc}).") from None
        if old.data_fingerprint and fingerprint != old.data_fingerprint:
            raise RunRefused(f"The training data of run '{old.name}' changed since it ran ({cfg.dataset_label}); "
                             "resuming would mix two datasets. Start a new run instead.")
        needed = list(old.needs_secrets)
        values = queue.secret_values(needed, secrets)
        missing = [n for n in needed if not values.get(n)]
        if missing:
            raise RunRefused(f"Run '{old.name}' used {', '.join(missing)}, which is never stored: enter it again "
                             f"to resume (or set {SECRET_ENV_NAMES} in the dashboard's environment).")
        step = int(checkpoint.name.rsplit("-", 1)[1])
        base = (old.name or old.id)[:60].rstrip()
        cfg = dataclasses.replace(cfg, resume_from_checkpoint=str(checkpoint), run_name=f"{base} (resumed)", **values)
        return self.start(cfg, parent=old, resumed_from_step=step, actor=actor)

    def resources(self, run_id: str) -> ResourceSample | None:
        """CPU/RAM of the run's worker process tree and the host's GPUs; None when it is not running."""
        run = self.store.get_run(run_id)
        if run is None or run.status.is_terminal():
            return None
        worker = self.launcher.adopt(run)
        if worker.pid is None or not worker.state().alive:
            return None
        return self._sampler.sample(worker.pid, queue.gpu_indices(run.devices))

    def alert_counts(self, run_ids: list[str]) -> dict[str, int]:
        return self.store.event_counts(run_ids, "alert")

    def delete_run(self, run_id: str, delete_files: bool = False, actor: access.Actor | None = None) -> None:
        """Remove a finished run from History and, when asked, its folder (only ever inside the runs root).

        Refused with RunRefused while the run is queued or active."""
        run = self.store.get_run(run_id)
        if run is None:
            raise RunRefused(f"There is no run {run_id}.")
        _authorize(actor, access.Action.DELETE, run.owner)
        if not run.status.is_terminal():
            raise RunRefused(f"Run '{run.name}' is {run.status.label.lower()}: stop it, or remove it from "
                             "the queue, before deleting it.")
        folder = paths.run_dir(run_id)  # refuses ids that would leave the runs root
        self.store.delete_run(run_id)
        if actor is not None:  # its timeline goes with it: the server log keeps who deleted it
            print(f"[finetune-studio] run {run_id} ({run.name!r}) deleted by {actor.name}"
                  + (" with its folder" if delete_files else ""), file=sys.stderr, flush=True)
        with self._lock:
            self._finished.pop(run_id)
        self._remote.forget(run_id)
        if delete_files and folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)  # rmtree unlinks symlinks inside the tree instead of following them

    def queue(self) -> list[RunRecord]:
        return self.store.queued_runs()

    def move_in_queue(self, run_id: str, offset: int, actor: access.Actor | None = None) -> bool:
        run = self.store.get_run(run_id)
        _authorize(actor, access.Action.REORDER, run.owner if run else "")
        with queue.start_lock():
            return self.store.move_in_queue(run_id, offset)

    def remove_from_queue(self, run_id: str, actor: access.Actor | None = None) -> None:
        """Take a queued run out of the queue (it stays in History as cancelled)."""
        self._request(run_id, control.Action.CANCEL, actor, access.Action.REORDER)

    def stop(self, run_id: str, actor: access.Actor | None = None) -> None:
        """Stop & save: the worker ends at the next step and saves a checkpoint and the adapter."""
        self._request(run_id, control.Action.STOP, actor, access.Action.STOP)

    def cancel(self, run_id: str, actor: access.Actor | None = None) -> None:
        """Cancel: the worker ends at the next step without saving."""
        self._request(run_id, control.Action.CANCEL, actor, access.Action.CANCEL)

    def active_run_id(self, kind: JobKind | None = JobKind.TRAIN) -> str | None:
        """A job with a worker now (a training run unless ``kind`` says otherwise; None: any kind)."""
        with self._lock:
            for run_id, tracked in self._tracked.items():
                if tracked.terminal is None and kind in (None, tracked.kind):
                    return run_id
        active = [r for r in self.store.active_runs() if kind in (None, r.kind)]
        return active[0].id if active else None

    def snapshot(self, run_id: str) -> LiveSnapshot | None:
        with self._lock:
            tracked = self._tracked.get(run_id)
            live = tracked.live if tracked else self._finished.get(run_id)
        if live is not None:
            return live.snapshot()
        return self._remote.snapshot(run_id)

    def list_runs(self, limit: int = HISTORY_PAGE, offset: int = 0, search: str = "",
                  owners: list[str] | None = None, kinds: list[JobKind] | None = None) -> list[RunRecord]:
        """A page of jobs, newest first (without their config and log tail: use get_run for those)."""
        return self.store.list_runs(limit=limit, offset=offset, search=search, owners=owners, kinds=kinds)

    def count_runs(self, search: str = "", owners: list[str] | None = None, kinds: list[JobKind] | None = None) -> int:
        return self.store.count_runs(search, owners, kinds)

    def run_owners(self) -> list[str]:
        return self.store.run_owners()

    def get_run(self, run_id: str) -> RunRecord | None:
        return self.store.get_run(run_id)

    def get_runs(self, run_ids: list[str]) -> list[RunRecord]:
        """The runs with these ids that exist, in the order asked for (any run, however old)."""
        return self.store.get_runs(run_ids)

    def metrics(self, run_id: str, lineage: bool = False, columns: Iterable[str] | None = None,
                keys: Iterable[str] | None = None) -> pd.DataFrame:
        """A run's metrics; with ``lineage``, preceded by those of the runs it resumed from; ``columns``: only
        ``step`` and these wide fields, ``keys``: these open metric keys (Store.metrics_frame)."""
        if not lineage:
            return self.store.metrics_frame(run_id, columns=columns, keys=keys)
        earlier, own = self.metrics_parts(run_id)
        frame = pd.concat([earlier, own], ignore_index=True) if len(earlier) else own
        if columns is None and keys is None:
            return frame
        wanted = {"step", *(columns if columns is not None else frame.columns), *(keys or ())}
        return frame[[c for c in frame.columns if c in wanted]]

    def metrics_parts(self, run_id: str, columns: Iterable[str] | None = None, keys: Iterable[str] | None = None
                      ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(metrics of the runs it resumed from, its own metrics): one read each; ``columns``: only ``step``
        and these wide fields, ``keys``: these open metric keys."""
        own = self.store.metrics_frame(run_id, columns=columns, keys=keys)
        run = self.store.get_run(run_id)
        if run is None or not run.parent_run_id:
            return own.iloc[:0], own
        earlier = lineage_frame(self.store, run)
        return (earlier if columns is None else earlier[[c for c in own.columns if c in earlier]]), own

    def metric_keys(self, run_id: str) -> list[str]:
        """The open metric keys a run logged (besides the wide fields), sorted."""
        return self.store.metric_keys(run_id)

    def events(self, run_id: str) -> list[EventRecord]:
        return self.store.get_events(run_id)

    def sparklines(self, runs: list[RunRecord]) -> dict[str, list[float]]:
        """History's loss sparklines, stored with the runs (computed once for runs recorded before)."""
        return self.store.sparklines(runs)

    def run_config(self, run_id: str) -> dict[str, Any]:
        run = self.store.get_run(run_id)
        if run is None:
            return {}
        return json.loads(run.config_json or "{}")

    def log_tail(self, run_id: str, lines: int = pump.LOG_TAIL_LINES) -> str:
        try:
            return pump.tail(paths.run_dir(run_id) / "worker.log", lines)
        except paths.UnsafePathError:
            return ""

    def log_text(self, run_id: str, max_bytes: int = 8 << 20) -> str:
        """The worker log (its last ``max_bytes`` when longer), for download and filtering."""
        try:
            return files.read_end(paths.run_dir(run_id) / "worker.log", max_bytes)
        except paths.UnsafePathError:
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
            if run is not None and run.status.is_terminal() and not self._is_tracked(run_id):
                return self.snapshot(run_id)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} still {run.status if run else 'missing'} after {timeout}s")
            time.sleep(interval)

    def close(self) -> None:
        """Stop pumping (workers keep running; another orchestrator can adopt them)."""
        adoption.close_holder(self.holder)  # queued runs whose secrets it held can no longer start
        self._closing.set()
        if self._thread:
            self._thread.join(timeout=5)
        with self._lock:
            tracked = list(self._tracked.values())
        for item in tracked:
            pump.flush(item, self.store)
            if item.terminal is not None:
                self._finish(item)  # its terminal line is behind the saved offset: settle it now
            else:
                item.lock_fh.close()
                item.log.close()
        with self._lock:
            self._tracked.clear()
        if self._presence is not None:
            self._presence.close()  # releases the shared lock
            self._presence = None

    # ================================================================== spawning
    def _launch(self, run: RunRecord, cfg: TrainConfig | JobSpec, lock_fh: IO) -> None:
        """Spawn the worker of a run just marked STARTING, holding its pump lock. Call with the start lock held."""
        run_dir = paths.run_dir(run.id)
        try:
            worker = self.launcher.start(run_dir, cfg)
        except OSError as exc:
            self.store.finish_run(run.id, RunStatus.FAILED, error=f"could not start the worker: {exc}")
            lock_fh.close()
            raise
        record = worker.record()  # what adopts it after a restart (the local launcher: pid and start time)
        self.store.update_run(run.id, **record)
        live = LiveRun(run.id, run.name, RunStatus.STARTING, phase="launching worker", model=run.model,
                       dataset=run.dataset, method=run.method, started_at=run.started_at,
                       total_steps=run.total_steps, output_dir=str(run_dir), step=run.resumed_from_step or 0)
        seed_lineage(live, run, self.store)
        with self._lock:
            self._tracked[run.id] = pump.Tracker(run.id, run_dir, live, 0, lock_fh, kind=run.kind, handle=worker,
                                                 pid=worker.pid, pid_started_at=record.get("pid_started_at"))

    def launch_queued(self) -> list[str]:
        """Start every queued run whose devices are free (any orchestrator may do it; the lock makes it once)."""
        self._last_queue_check = time.monotonic()
        if not self.store.queued_runs():
            return []
        launched = []
        with queue.start_lock():
            waiting = self.store.queued_runs()  # re-read under the lock
            free = set(queue.startable([(r.id, r.devices) for r in waiting], [r.devices for r in self.store.active_runs()]))
            for run in waiting:
                if run.id in free and self._launch_queued_alone(run):
                    launched.append(run.id)
        return launched

    def _launch_queued_alone(self, run: RunRecord) -> bool:
        """Launch one queued job; one that cannot be started fails alone, with the reason, and the queue goes on
        (a failure left to the pump thread's catch-all repeated on every tick and held every job behind it)."""
        try:
            return self._launch_queued(run)
        except Exception as exc:  # noqa: BLE001 - this job only; the next ones in the queue still start
            with self._lock:
                tracked = run.id in self._tracked
            if not tracked:  # a worker already launched is the pump's to follow
                self.store.finish_run(run.id, RunStatus.FAILED, error=f"it could not be started when its turn came "
                                                                      f"({type(exc).__name__}: {exc})")
            return False

    def _launch_queued(self, run: RunRecord) -> bool:
        cfg = queue.config_when_due(run, self.store, self._secrets.get(run.id), self.holder)
        if cfg is None:
            return False
        run_dir = paths.run_dir(run.id)
        lock_fh = adoption.try_lock(run_dir)
        if lock_fh is None:
            return False  # another orchestrator holds it (it cannot be launching it: we hold the start lock)
        started = time.time()
        self.store.update_run(run.id, status=RunStatus.STARTING.value, phase="launching worker",
                              started_at=started, queue_position=None)
        self.store.add_event(run.id, "status", "Starting: left the queue")
        self._secrets.pop(run.id, None)
        self._launch(run.replace(started_at=started), cfg, lock_fh)
        return True

    # ================================================================== control
    def _request(self, run_id: str, action: control.Action, actor: access.Actor | None = None,
                 permission: access.Action = access.Action.STOP) -> None:
        run = self.store.get_run(run_id)
        if run is None or run.status.is_terminal():
            return
        _authorize(actor, permission, run.owner)
        if run.status is RunStatus.QUEUED:
            with queue.start_lock():  # the queue may be launching it right now: decide under its lock
                run = self.store.get_run(run_id)
                if run is not None and run.status is RunStatus.QUEUED:
                    self._secrets.pop(run_id, None)
                    self.store.finish_run(run_id, RunStatus.CANCELLED, phase="removed from the queue",
                                          queue_position=None)
                    self.store.add_event(run_id, "control", "removed from the queue" + _by(actor))
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
                    adoption.relock(tracked)
                tracked.stop_requested_at = tracked.stop_requested_at or time.time()
                tracked.live.update(status=RunStatus.STOPPING,
                                    phase="stopping (saving)" if action is control.Action.STOP else "cancelling")
        self.store.update_run(run_id, status=RunStatus.STOPPING.value,
                              phase="stopping (saving)" if action is control.Action.STOP else "cancelling")
        self.store.add_event(run_id, "control", f"{action.value} requested" + _by(actor))

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

    def _pump_run(self, t: pump.Tracker) -> bool:
        """Read new events of one job; True when the job finished in this call."""
        if not (t.run_dir / ".pump.lock").exists():
            adoption.relock(t)
        pump.drain(t, self.store, max_reads=pump.READS_PER_TICK)
        exited, exit_desc = adoption.exited(t)
        if t.terminal is None and exited:
            # Read everything the worker wrote before exiting, then decide: after a restart the backlog
            # of a run that finished while nobody pumped it can be many reads long.
            pump.drain(t, self.store, max_reads=None)
            if t.terminal is None:
                # A server stopped between storing the offset past the final event and settling the run
                # (the worker was still tearing down): the outcome is already in the log, behind the offset.
                final = t.log.last_terminal_event()
                if final is not None:
                    pump.handle(t, final)
            if t.terminal is None:
                error = f"The worker {exit_desc} before finishing."
                tail = pump.tail(t.run_dir / "worker.log", pump.LOG_TAIL_LINES)
                if t.stop_requested_at and t.terminated_at:
                    error = (f"The worker did not stop within {adoption.STOP_TIMEOUT_S:.0f}s and was terminated "
                             f"({exit_desc}).")
                pump.set_terminal(t, RunStatus.FAILED, error=error, log_tail=tail)
        adoption.watchdog(t, self.store)
        if pump.flush_due(t):
            pump.flush(t, self.store)
        if t.terminal is not None and (exited or not t.handle.started_here):
            self._finish(t)
            return True
        return False

    def _finish(self, t: pump.Tracker) -> None:
        status, values = t.terminal
        self.store.finish_run(t.run_id, status, **values)
        t.live.update(status=status, finished_at=time.time(), phase=values.get("phase", ""),
                      **{k: v for k, v in values.items() if k in ("error", "log_tail", "output_dir")})
        with self._lock:
            self._tracked.pop(t.run_id, None)
            self._finished.put(t.run_id, t.live)
        t.lock_fh.close()
        t.log.close()

    # ================================================================== adoption
    def _adopt_orphans(self) -> None:
        """Follow jobs that the database says are active but nobody in this process is pumping."""
        self._last_adopt = time.monotonic()
        for tracked in adoption.orphans(self.store, self._is_tracked, self.launcher):
            with self._lock:
                self._tracked[tracked.run_id] = tracked
            self._remote.forget(tracked.run_id)

    def _is_tracked(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self._tracked

    # ================================================================== serving (serve jobs)
    def start_server(self, sources: list[jobspec.ModelSource], actor: access.Actor | None = None,
                     purpose: str = "playground", host: str = "127.0.0.1", port: int = 0,
                     idle_timeout_s: int = serve_spec.DEFAULT_IDLE_S, engine: str = "auto",
                     name: str = "", tied: bool | None = None, **limits) -> tuple[str, str]:
        """Start (or queue) a serve job for ``sources``; returns (job id, API key). The key is generated
        here and only its sha256 is stored; a playground server's key stays in this orchestrator's memory
        (``server_key``), an endpoint's is shown once by the caller. ``tied`` (default: a playground's) ends
        the job when this process exits, queued or serving: nobody else has its key. ``limits``: the
        ServeSpec fields max_tokens_cap, request_timeout_s, tls_certfile, tls_keyfile. ConfigError lists
        every problem."""
        key = pysecrets.token_urlsafe(32)
        labels = ", ".join(s.key.removeprefix("run:").removeprefix("base:") for s in sources)
        tied = purpose == "playground" if tied is None else tied
        spec = serve_spec.ServeSpec(
            name=name or f"{'Playground' if purpose == 'playground' else 'Endpoint'} · {labels}"[:80],
            sources=list(sources), host=host, port=port, api_key_hash=serve_spec.hash_key(key),
            idle_timeout_s=idle_timeout_s, engine=engine, purpose=purpose,
            consumer=serve_spec.consumer_token() if tied else "", **limits)
        job_id = self.submit(spec, actor)
        if purpose == "playground":
            with self._lock:
                self._server_keys[job_id] = key
        return job_id, key

    def server_key(self, job_id: str) -> str | None:
        """The API key of a playground server this orchestrator started (None otherwise, or once it ended)."""
        with self._lock:
            key = self._server_keys.get(job_id)
        run = self.store.get_run(job_id) if key else None
        if run is None or run.status.is_terminal():
            with self._lock:
                self._server_keys.pop(job_id, None)
            return None
        return key

    def endpoint(self, job_id: str) -> endpoint_file.Endpoint | None:
        """Where a serve job listens and what it serves, while it runs (None before it is ready and after)."""
        run = self.store.get_run(job_id)
        if run is None or run.kind is not JobKind.SERVE or run.status not in (RunStatus.STARTING, RunStatus.RUNNING):
            return None
        try:
            found = endpoint_file.read(paths.run_dir(job_id))
        except paths.UnsafePathError:
            return None
        alive = found is not None and found.pid == run.pid and self.launcher.adopt(run).state().alive
        return found if alive else None

    def find_server(self, sources: list[jobspec.ModelSource], actor: access.Actor | None = None) -> str | None:
        """A queued or active playground server of ``actor`` serving exactly ``sources``, whose key this
        orchestrator holds (to reuse rather than load the same models twice); None when there is none."""
        wanted = sorted(s.key for s in sources)
        for run in self.store.active_runs() + self.store.queued_runs():
            if run.kind is not JobKind.SERVE or (actor is not None and run.owner != actor.name):
                continue
            if run.status is RunStatus.STOPPING or self.server_key(run.id) is None:
                continue
            spec = json.loads(self.store.get_run(run.id).config_json or "{}")
            if spec.get("purpose") == "playground" and sorted(
                    jobspec.ModelSource.from_dict(s).key for s in spec.get("sources", [])) == wanted:
                return run.id
        return None
    # ================================================================== samples during training
    def samples(self, run_id: str, max_steps: int = 50) -> list[SampleRecord]:
        """A run's sample answers, newest sampling step first (the store holds what the pump has read)."""
        return self.store.samples(run_id, max_steps)

    def sample_prompts(self, run_ids: list[str]) -> list[str]:
        return self.store.sample_prompts(run_ids)

    def prompt_samples(self, run_ids: list[str], prompt: str) -> list[SampleRecord]:
        return self.store.prompt_samples(run_ids, prompt)

    # ================================================================== evaluation (issue 11)
    def start_eval(self, spec: EvalSpec, actor: access.Actor | None = None) -> tuple[str, str | None]:
        """Submit an eval job, and the base model's baseline on the same data and settings when the source is
        a run's model and no such baseline exists or is under way. Returns (eval job id, baseline job id)."""
        return evals.start(self, spec, actor)

    def eval_result(self, job_id: str) -> EvalResultRecord | None:
        return self.store.eval_result(job_id)

    def eval_results(self, run_id: str) -> list[EvalResultRecord]:
        """Every eval of a run's models, newest first."""
        return self.store.eval_results(run_id)

    def eval_baseline(self, result: EvalResultRecord) -> EvalResultRecord | None:
        """The base model's eval on the same data and settings and, once completed, the same rows (None when
        there is none, or it is the same job)."""
        return evals.baseline_of(self.store, result)

    def eval_samples(self, job_id: str) -> pd.DataFrame:
        return self.store.eval_samples(job_id)

    def eval_predictions(self, job_id: str) -> list[dict]:
        """What a running eval has written to its predictions file so far."""
        return evals.read_predictions(job_id)

    def latest_eval_metrics(self, run_ids: list[str]) -> dict[str, dict]:
        return self.store.latest_eval_metrics(run_ids)

    # ================================================================== export artifacts
    def artifacts(self, source_run_id: str | None = None, job_id: str | None = None) -> list[ArtifactRecord]:
        """Published export artifacts of a run's exports (or of one export job), newest first."""
        return self.store.artifacts(job_id=job_id, source_run_id=source_run_id)

    def endpoint_jobs(self, run_id: str) -> list[RunRecord]:
        """The endpoint servers started on a run's model, newest first (playground servers are the Playground's)."""
        jobs = [r for r in reversed(self.store.children(run_id)) if r.kind is JobKind.SERVE]
        return [r for r in jobs if self.run_config(r.id).get("purpose") == "endpoint"]

    def export_jobs(self, run_id: str) -> list[RunRecord]:
        """The export jobs started on a run's model, newest first."""
        return [r for r in reversed(self.store.children(run_id)) if r.kind is JobKind.EXPORT]


# ====================================================================== helpers
def _authorize(actor: access.Actor | None, action: access.Action, owner: str) -> None:
    """No actor: a caller inside this process that already decided (tests, the queue itself)."""
    if actor is not None:
        try:
            access.check(actor, action, owner)
        except access.NotAllowed as exc:
            raise RunRefused(f"Not allowed: {exc}") from None


def _by(actor: access.Actor | None) -> str:
    return f" by {actor.name}" if actor else ""


def with_absolute_paths(cfg: TrainConfig) -> TrainConfig:
    """Pin relative dataset/model paths to absolute ones, so the worker and a later resume read the
    same files whatever directory they run in."""
    def pin(sources: list[str], field_name: str) -> list[str]:
        return [s if s.startswith("bundled:") else str(resolve_source(s, field_name)) for s in sources]

    model = cfg.model_name
    if looks_like_path(model):
        model = str(Path(model).expanduser().resolve())
    return dataclasses.replace(cfg, model_name=model,
                               local_datasets=pin(cfg.local_datasets, "local_datasets"),
                               local_eval_datasets=pin(cfg.local_eval_datasets, "local_eval_datasets"))


def _json(data: dict) -> str:
    return json.dumps(data, sort_keys=True)


def _write_train_job(run_dir: Path, cfg: TrainConfig, rewards: list) -> None:
    """config.yaml, and a copy of each custom reward file with its sha256 (the worker loads only the copy)."""
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    reward_files.snapshot(rewards, run_dir)
