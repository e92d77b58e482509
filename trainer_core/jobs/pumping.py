"""The orchestrator's background work: launching a job now or when its devices are free (the queue), and the
pump thread that follows every active job's events.jsonl into the live state and the database, finishes jobs
whose worker ended and adopts the ones an earlier server left running.

``self`` is the Orchestrator (trainer_core/jobs/orchestrator.py), which composes this class."""
from __future__ import annotations

import sys
import time
from typing import IO

from db.entities import RunRecord
from trainer_core.config import TrainConfig
from trainer_core.data import fingerprint as data_fingerprints
from trainer_core.jobs import adoption, pump, queue
from trainer_core.specs.jobspec import JobSpec
from trainer_core.jobs.live import LiveRun
from trainer_core.jobs.remote_view import seed_lineage
from trainer_core.protocol import paths, secret_file
from trainer_core.protocol.status import RunStatus


POLL_S = 0.25
ADOPT_EVERY_S = 2.0
QUEUE_EVERY_S = 1.0  # queued runs also start when a run ended in another orchestrator (another server, the CLI)


class Pumping:
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
        # the files may have changed while it waited: check what it will read now (unreadable: it fails alone)
        checked = data_fingerprints.take(cfg) if isinstance(cfg, TrainConfig) else None
        lock_fh = adoption.try_lock(run_dir)
        if lock_fh is None:
            return False  # another orchestrator holds it (it cannot be launching it: we hold the start lock)
        started = time.time()
        retaken = {}
        if checked is not None:
            data_fingerprints.write_checked(run_dir, checked)
            retaken = {"data_fingerprint": checked.digest}
        self.store.update_run(run.id, status=RunStatus.STARTING.value, phase="launching worker",
                              started_at=started, queue_position=None, **retaken)
        self.store.add_event(run.id, "status", "Starting: left the queue")
        self._secrets.pop(run.id, None)
        self._launch(run.replace(started_at=started), cfg, lock_fh)
        return True

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
        adoption.notice_request(t)  # also a request another process made: whoever pumps enforces it
        adoption.notice_stall(t)
        adoption.watchdog(t, self.store)
        if pump.flush_due(t):
            pump.flush(t, self.store)
        # Settled once its worker has exited, whoever started it: an adopted worker still tearing down after its
        # final event holds its memory (a GPU's VRAM), and a settled run frees its devices for the queue.
        if t.terminal is not None and exited:
            adoption.clean_after_exit(t, self.store)  # checkpoints a kill -9 left half-written
            self._finish(t)
            return True
        return False

    def _finish(self, t: pump.Tracker) -> None:
        status, values = t.terminal
        if "log_tail" in values:  # read again now the worker has exited: what it printed after its error event (the
            # traceback) passes through worker/bounded_log.py's pipe and may have reached worker.log only since
            values = {**values, "log_tail": pump.tail(t.run_dir / "worker.log", pump.LOG_TAIL_LINES)}
        secret_file.remove(t.run_dir)  # a Ray job's secrets, whatever ended it (its worker or driver removes them)
        self.store.finish_run(t.run_id, status, **values)
        t.live.update(status=status, finished_at=time.time(), phase=values.get("phase", ""),
                      **{k: v for k, v in values.items() if k in ("error", "log_tail", "output_dir")})
        with self._lock:
            self._tracked.pop(t.run_id, None)
            self._finished.put(t.run_id, t.live)
        t.lock_fh.close()
        t.log.close()

    def catch_up(self) -> None:
        """Read, once, the log of every active job that nobody pumps, and settle those whose worker has exited:
        what `runs` and `runs show` do when no dashboard follows the jobs. For an orchestrator made with
        start_pump=False; closing it leaves the jobs still under way to whoever pumps next."""
        self._adopt_orphans()
        with self._lock:
            tracked = list(self._tracked.values())
        for t in tracked:
            self._pump_run(t)

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
