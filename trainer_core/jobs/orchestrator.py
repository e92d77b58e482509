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

The Orchestrator class here holds the writes (start, submit, resume, delete, the queue, Stop and Cancel) and
composes the rest: what pages read (queries.py), launching and the pump thread (pumping.py), model servers
(servers.py); who may do what is refusals.py.

Kept whole: the writes share one sequence (check who may, validate, write the run folder and its journal, record,
launch or queue) and one lock with the pump; each is short, and splitting them would split that sequence.
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
from typing import Any, Callable

from db.entities import RunRecord
from db.store import Store
from trainer_core.auth import access
from trainer_core.specs import checkpoints, jobspec
from trainer_core.data.bounded_cache import BoundedCache
from trainer_core.config import ConfigError, FieldError, TrainConfig, looks_like_path
from trainer_core.data import DatasetError, loading
from trainer_core.data import fingerprint as data_fingerprints
from trainer_core.data.fingerprint import data_fingerprint
from trainer_core.data.sources import resolve_source
from trainer_core.methods import METHODS
from trainer_core.jobs import adoption, evals, pump, queue, resource_check
from trainer_core.jobs.pumping import Pumping
from trainer_core.jobs.queries import Queries
from trainer_core.jobs.refusals import RunRefused, authorize, by_actor
from trainer_core.jobs.servers import Servers
from trainer_core.jobs.launcher import PlacingLauncher, cluster_devices, launcher_problems
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.specs.jobspec import JobSpec
from trainer_core.jobs.live import LiveRun
from trainer_core.jobs.remote_view import RemoteViews
from trainer_core.jobs.resources import ResourceSampler
from trainer_core.launchers import Launcher
from trainer_core.protocol import control, paths
from trainer_core.protocol.secrets import ENV_NAMES as SECRET_ENV_NAMES
from trainer_core.protocol.status import JobKind, RunStatus, write_kind

LIVE_KEEP = 20  # finished runs kept in memory for snapshots; older ones are rebuilt from the database
REMOTE_KEEP = 20  # views of runs pumped by other processes, refreshed incrementally from the database


class Orchestrator(Queries, Pumping, Servers):
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
        self._closers: list[Callable[[], None]] = []  # what runs beside it (a sweep runner): closed first
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
              actor: access.Actor | None = None, sweep: tuple[str, int] | None = None) -> str:
        """Record a run and start it now, or queue it when its devices are busy. Returns the run id.

        Queued runs start by themselves (also after a server restart) when the runs before them end.
        ``actor`` (the pages and the CLI always give one) must be allowed to start runs and owns the run.
        ``sweep``: (sweep id, trial number) when the run is a sweep's trial (trainer_core/sweeps); a resumed run
        keeps its parent's."""
        authorize(actor, access.Action.START, "")
        if actor is not None and actor.role is not access.Role.ADMIN:
            refused = admin_reasons(cfg)  # code the run would run on this host: its method's hook, remote code
            if refused:
                raise RunRefused("Not allowed: " + " ".join(refused))
        errors = self.validate(cfg)
        if errors:
            raise ConfigError(errors)
        cfg = with_absolute_paths(cfg)
        name = cfg.run_name or f"{cfg.method_label} · {{stamp}}"
        checked = data_fingerprints.take(cfg)  # taken again when a queued run's turn comes; the worker records its own
        row = dict(model=cfg.model_label, dataset=cfg.dataset_label, method=cfg.method_label,
                   total_steps=cfg.max_steps, config_json=_json(cfg.to_public_dict()),
                   data_fingerprint=checked.digest, needs_secrets=tuple(cfg.secrets()),
                   parent_run_id=parent.id if parent else None, resumed_from_step=resumed_from_step,
                   steps_done=resumed_from_step or 0)
        if sweep is None and parent is not None and parent.sweep_id:
            sweep = (parent.sweep_id, parent.sweep_trial)
        if sweep is not None:  # in the row as created, so the journal's create record restores it (db rebuild)
            row.update(sweep_id=sweep[0], sweep_trial=sweep[1])
        run_id = self._record(JobKind.TRAIN, cfg, name, row, actor,
                              lambda run_dir: _write_train_job(run_dir, cfg, checked),
                              note=(f"resumed from run '{parent.name}' at step {resumed_from_step}" + by_actor(actor))
                              if parent is not None else "")
        return run_id

    def submit(self, spec: JobSpec, actor: access.Actor | None = None) -> str:
        """Record a job of a kind other than training (serve, eval, export) and start it now, or queue it
        when its devices are busy, exactly like ``start``. Returns the job id; ConfigError lists every
        problem of the spec."""
        authorize(actor, access.Action.START, "")
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
        authorize(actor, access.Action.RESUME, old.owner)
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


    def delete_run(self, run_id: str, delete_files: bool = False, actor: access.Actor | None = None) -> None:
        """Remove a finished run from History and, when asked, its folder (only ever inside the runs root).

        Refused with RunRefused while the run is queued or active."""
        run = self.store.get_run(run_id)
        if run is None:
            raise RunRefused(f"There is no run {run_id}.")
        authorize(actor, access.Action.DELETE, run.owner)
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


    def move_in_queue(self, run_id: str, offset: int, actor: access.Actor | None = None) -> bool:
        run = self.store.get_run(run_id)
        authorize(actor, access.Action.REORDER, run.owner if run else "")
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


    def add_closer(self, close: Callable[[], None]) -> None:
        """Close ``close``'s owner with this orchestrator, before it (a sweep runner starts runs through it)."""
        self._closers.append(close)

    def close(self) -> None:
        """Stop pumping (workers keep running; another orchestrator can adopt them)."""
        for closer in self._closers:
            closer()
        self._closers.clear()
        adoption.close_holder(self.holder)  # queued runs whose secrets it held can no longer start
        self._closing.set()
        if self._thread:
            self._thread.join(timeout=5)
        with self._lock:
            tracked = list(self._tracked.values())
        for item in tracked:
            pump.flush(item, self.store)
            if item.terminal is not None and adoption.exited(item)[0]:
                self._finish(item)  # its terminal line is behind the saved offset: settle it now
            else:  # a worker still exiting after its final event is settled by the next to adopt it, once it has exited
                item.lock_fh.close()
                item.log.close()
        with self._lock:
            self._tracked.clear()
        if self._presence is not None:
            self._presence.close()  # releases the shared lock
            self._presence = None


    # ================================================================== control
    def _request(self, run_id: str, action: control.Action, actor: access.Actor | None = None,
                 permission: access.Action = access.Action.STOP) -> None:
        run = self.store.get_run(run_id)
        if run is None or run.status.is_terminal():
            return
        authorize(actor, permission, run.owner)
        if run.status is RunStatus.QUEUED:
            with queue.start_lock():  # the queue may be launching it right now: decide under its lock
                run = self.store.get_run(run_id)
                if run is not None and run.status is RunStatus.QUEUED:
                    self._secrets.pop(run_id, None)
                    self.store.finish_run(run_id, RunStatus.CANCELLED, phase="removed from the queue",
                                          queue_position=None)
                    self.store.add_event(run_id, "control", "removed from the queue" + by_actor(actor))
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
                tracked.live.update(status=RunStatus.STOPPING, phase=adoption.stopping_phase(action))
        # Not pumped here (the CLI, a second dashboard): whoever pumps it sees control.json (adoption.notice_request)
        self.store.update_run(run_id, status=RunStatus.STOPPING.value, phase=adoption.stopping_phase(action))
        self.store.add_event(run_id, "control", f"{action.value} requested" + by_actor(actor))


    # ================================================================== evaluation (issue 11)
    def start_eval(self, spec: EvalSpec, actor: access.Actor | None = None) -> tuple[str, str | None]:
        """Submit an eval job, and the base model's baseline on the same data and settings when the source is
        a run's model and no such baseline exists or is under way. Returns (eval job id, baseline job id)."""
        return evals.start(self, spec, actor)


# ====================================================================== helpers


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


def admin_reasons(cfg: TrainConfig) -> list[str]:
    """Why only an admin may start ``cfg``: code it would run on this host (its method's own reasons, e.g. GRPO's
    Python rewards; trust_remote_code). A method says its reasons through its spec's hook, never by name here."""
    method = METHODS.get(cfg.method)
    reasons = list(method.admin_reasons(cfg)) if method is not None and method.admin_reasons is not None else []
    if cfg.trust_remote_code is True:
        reasons.append("trust_remote_code runs Python from the model's repository on this host, so only an admin may "
                       "start a run with it; turn it off, or ask an admin to start the run.")
    return reasons


def _write_train_job(run_dir: Path, cfg: TrainConfig, checked: data_fingerprints.Fingerprint) -> None:
    """config.yaml, the data fingerprint checked now (the worker compares what it loads with it), and the files the
    run's method needs beside them (GRPO: a copy of each custom reward file with its sha256, which the worker loads)."""
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    data_fingerprints.write_checked(run_dir, checked)
    method = METHODS.get(cfg.method)
    if method is not None and method.job_files is not None:
        method.job_files(cfg, run_dir)
