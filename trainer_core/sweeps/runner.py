"""Sweeps in a process that holds an orchestrator (the dashboard, the CLI's ``sweep``): start, stop, resume and
extend them, and drive every active one this process can lock, in a thread beside the pump.

Why a thread here and not a job kind of its own: the driver only asks Optuna and starts runs through the
orchestrator. As a worker it would hold a queue place, run in a sandbox that hides the data root and the database
it must write, and need an orchestrator of its own inside a worker. Here every step reads the truth again from the
sweep's folder, the study's journal and the trial runs' rows, so a restart loses nothing: whichever process takes the
sweep's lock (``driver.lock``, flock) next -- the dashboard coming back, or the CLI -- carries on where it stopped.
"""
from __future__ import annotations

import fcntl
import shutil
import sys
import threading
from typing import IO

from trainer_core.auth import access
from trainer_core.config import ConfigError, FieldError, TrainConfig
from trainer_core.jobs.orchestrator import admin_reasons
from trainer_core.jobs.refusals import RunRefused, authorize
from trainer_core.protocol import paths
from trainer_core.sweeps import record
from trainer_core.sweeps.driver import SweepDriver, open_study
from trainer_core.sweeps.record import SweepStatus
from trainer_core.sweeps.checks import problems
from trainer_core.sweeps.spec import SweepConfig

TICK_S = 1.0


class SweepRunner:
    def __init__(self, orch, start_thread: bool = True, tick_s: float = TICK_S):
        self.orch = orch
        self.tick_s = tick_s
        self._drivers: dict[str, tuple[SweepDriver, IO]] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._thread = None
        if start_thread:
            self._thread = threading.Thread(target=self._forever, name="studio-sweeps", daemon=True)
            self._thread.start()

    # ================================================================== requests
    def create(self, config: SweepConfig, actor: access.Actor | None = None, name: str = "") -> str:
        """Check the sweep like a run (the base config, its data, every range) and record it; the driver starts
        its first trials on its next tick. ConfigError lists every problem."""
        actor = actor or access.Actor.local()
        authorize(actor, access.Action.START, "")
        errors = problems(config.spec, config.base)  # its ranges first: they name the field and the fix
        if errors:
            raise ConfigError(errors)
        cfg = TrainConfig.from_dict(config.base)
        errors = self.orch.validate(cfg)  # the base config as a run: its data files, the device's memory
        if errors:
            raise ConfigError(errors)
        if actor.role is not access.Role.ADMIN and admin_reasons(cfg):
            raise RunRefused("Not allowed: " + " ".join(admin_reasons(cfg)))
        return record.create(SweepConfig(cfg.to_public_dict(), config.spec), actor.name, actor.role.value, name)

    def stop(self, sweep_id: str, actor: access.Actor | None = None) -> None:
        """Stop a sweep: its running trials stop and save, its queued ones leave the queue, nothing new starts."""
        state = self._state(sweep_id, actor, access.Action.STOP)
        if state.status is SweepStatus.RUNNING:
            record.set_status(sweep_id, SweepStatus.STOPPING, f"stop requested by {(actor or access.Actor.local()).name}")

    def resume(self, sweep_id: str, more_trials: int = 0, actor: access.Actor | None = None) -> None:
        """Resume a stopped sweep (its stopped trials continue from their checkpoints), or extend a sweep by
        ``more_trials`` (a completed one starts again)."""
        state = self._state(sweep_id, actor, access.Action.RESUME)
        if more_trials < 0:
            raise ConfigError([FieldError("more_trials", "cannot be negative")])
        if state.status is SweepStatus.STOPPING:
            raise RunRefused("The sweep is still stopping; resume it once its trials have stopped.")
        if state.status is SweepStatus.COMPLETED and not more_trials:
            raise RunRefused("The sweep has spent its budget: give more trials to extend it.")
        if more_trials:
            record.extend(sweep_id, _asked(state) + more_trials)
        if state.status is not SweepStatus.RUNNING:
            record.set_status(sweep_id, SweepStatus.RUNNING, "resumed")

    def free_disk(self, sweep_id: str, keep: set[str], actor: access.Actor | None = None) -> tuple[int, int]:
        """Delete the checkpoints of a completed sweep's trial runs except the runs in ``keep`` (the best trial's);
        their adapters, configs and logs stay, and so do the runs in History. Returns (runs, bytes freed). Only
        when asked (the Sweeps page's button), never by default, and never while the sweep may resume a trial."""
        state = self._state(sweep_id, actor, access.Action.DELETE)
        if state.status is not SweepStatus.COMPLETED:
            raise RunRefused("Only a completed sweep's checkpoints are deleted: a stopped one resumes its trials "
                             "from them.")
        runs, freed = 0, 0
        for run in self.orch.store.sweep_runs(sweep_id):
            folder = paths.run_dir(run.id) / "checkpoints"  # run_dir refuses ids that would leave the runs root
            if run.id in keep or not run.status.is_terminal() or folder.is_symlink() or not folder.is_dir():
                continue
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
            shutil.rmtree(folder)  # rmtree unlinks symlinks inside the tree instead of following them
            self.orch.store.add_event(run.id, "sweep", f"checkpoints deleted to free disk ({size / 1e6:.1f} MB), "
                                                       f"asked on sweep {sweep_id}")
            runs, freed = runs + 1, freed + size
        return runs, freed

    def _state(self, sweep_id: str, actor: access.Actor | None, action: access.Action) -> record.SweepState:
        try:
            state = record.read(sweep_id)
        except (FileNotFoundError, record.UnsafePathError):
            raise RunRefused(f"There is no sweep {sweep_id}.") from None
        authorize(actor, action, state.owner)
        return state

    # ================================================================== driving
    def tick_once(self) -> None:
        """Take every active sweep nobody drives, and move each driven one on."""
        for sweep_id in record.list_ids():
            if sweep_id not in self._drivers:
                self._attach(sweep_id)
        for sweep_id, (driver, lock_fh) in list(self._drivers.items()):
            try:
                status = driver.tick()
            except Exception as exc:  # noqa: BLE001 - one sweep's bad tick must not stop the others; retried next tick
                print(f"[finetune-studio] sweep {sweep_id}: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            if not status.is_active():
                self._release(sweep_id)

    def _attach(self, sweep_id: str) -> None:
        if not record.status(sweep_id).is_active():  # most sweeps have ended: their state journal alone says so
            return
        lock_fh = open(record.sweep_dir(sweep_id) / record.LOCK_FILE, "a")
        try:
            fcntl.flock(lock_fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process (or orchestrator) drives it
            lock_fh.close()
            return
        try:
            driver = SweepDriver(self.orch, record.read(sweep_id))
        except Exception:
            lock_fh.close()
            raise
        with self._lock:
            self._drivers[sweep_id] = (driver, lock_fh)

    def _release(self, sweep_id: str) -> None:
        with self._lock:
            _, lock_fh = self._drivers.pop(sweep_id)
        lock_fh.close()

    def driving(self) -> list[str]:
        with self._lock:
            return sorted(self._drivers)

    def _forever(self) -> None:
        while not self._closing.is_set():
            try:
                self.tick_once()
            except Exception as exc:  # noqa: BLE001 - the thread must survive a bad tick; it retries next tick
                print(f"[finetune-studio] sweeps: {type(exc).__name__}: {exc}", file=sys.stderr)
            self._closing.wait(self.tick_s)

    def close(self) -> None:
        """Stop driving (the trials keep running; the next process to take the locks carries on)."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for sweep_id in list(self._drivers):
            self._release(sweep_id)


def _asked(state: record.SweepState) -> int:
    return len(open_study(state.folder, state.config.spec).get_trials(deepcopy=False))
