"""Workers on this host: ``python -m trainer_core.worker RUN_DIR``, or torchrun's launcher
(``-m trainer_core.worker.launch``) when a run uses several processes, in the run folder, in a session of its own
so that it outlives the server, writing to worker.log.

Liveness is the process handle when this process started the worker, else its pid checked against the process
start time recorded at start (pids are reused). What environment a job gets is decided by the jobs layer
(``trainer_core.jobs.launcher.WorkerLauncher.environment``: an allow-list); this module only runs it.
"""
from __future__ import annotations

import os
import signal
import subprocess
from abc import abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from trainer_core.host import parallel
from trainer_core.launchers.base import ALIVE, JobHandle, JobState, Launcher
from trainer_core.protocol import sandbox

if TYPE_CHECKING:
    from db.entities import RunRecord
    from trainer_core.config import TrainConfig
    from trainer_core.specs.jobspec import JobSpec

DISAPPEARED = "process disappeared (it was started by an earlier dashboard; exit code unknown)"
NEVER_STARTED = JobState(alive=False, reason="never started (no process id recorded)", started=False)


class LocalHandle(JobHandle):
    """A worker process of this host: its Popen when this process started it, else its pid and start time."""

    def __init__(self, pid: int | None, started_at: float | None, proc: subprocess.Popen | None = None,
                 sandboxed: bool = False):
        self.pid, self.started_at, self.proc = pid, started_at, proc
        self.started_here = proc is not None
        self.sandboxed = sandboxed  # the process is bubblewrap, which exits 128+N for a command killed by signal N

    def record(self) -> dict[str, Any]:
        return {"pid": self.pid, "pid_started_at": self.started_at}

    def state(self) -> JobState:
        if self.proc is not None:
            code = self.proc.poll()
            if code is not None and self.sandboxed:
                code = sandbox.exit_reason(code)
            return ALIVE if code is None else JobState(False, describe_exit(code))
        if self.pid is None:
            return NEVER_STARTED
        return ALIVE if pid_alive(self.pid, self.started_at) else JobState(False, DISAPPEARED)

    def request_stop(self) -> None:
        signal_group(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        signal_group(self.pid, signal.SIGKILL)


class LocalLauncher(Launcher):
    """Runs each worker as a process of this host; a subclass says which environment a job gets."""

    @abstractmethod
    def environment(self, run_dir: Path, cfg: TrainConfig | JobSpec, processes: int) -> dict[str, str]:
        """The worker's whole environment (nothing of the server's is inherited otherwise)."""

    def command(self, run_dir: Path, processes: int) -> list[str]:
        return parallel.worker_command(run_dir, processes)

    def spawn(self, run_dir: Path, cfg: TrainConfig | JobSpec) -> subprocess.Popen:
        processes = parallel.process_count(cfg)
        env = self.environment(run_dir, cfg, processes)
        command = self.command(run_dir, processes)
        sandboxed = sandbox.enabled()  # SandboxError (an OSError: the start fails, saying why) when it must and cannot
        with open(run_dir / "worker.log", "ab") as log:
            if sandboxed:
                command = self.sandboxed(command, run_dir, cfg, env)
            else:
                log.write((sandbox.UNSANDBOXED_WARNING + "\n").encode())
                log.flush()
            return subprocess.Popen(
                command,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=run_dir,
                start_new_session=True,  # own session: Ctrl-C or a restart of the server does not reach it
                close_fds=True)

    def sandboxed(self, command: list[str], run_dir: Path, cfg: TrainConfig | JobSpec,
                  env: dict[str, str]) -> list[str]:
        """``command`` inside the sandbox: its own folder writable (and an export's target), what its config names
        read-only, the network when it needs it, the host's PIDs only for a serve job tied to a process here."""
        config = cfg.to_dict() if hasattr(cfg, "KIND") else cfg.to_public_dict()
        readable, runs, network = sandbox.job_inputs(config, own_run=run_dir.name)
        kind = getattr(getattr(cfg, "KIND", None), "value", "train")
        out_dir = getattr(cfg, "out_dir", "")
        writable = [run_dir] + ([Path(out_dir)] if isinstance(out_dir, str) and out_dir.strip() else [])
        writable += cfg.writable_paths() if hasattr(cfg, "writable_paths") else []
        if kind == "serve":  # an adapter is merged once into its run's serving/ cache, which later serve jobs reuse
            served = {source.run_id for source in cfg.model_sources() if source.run_id}
            writable += [run / "serving" for run in runs if run.name in served]
        readable += runs + self.sandbox_inputs(run_dir, cfg, env)
        return sandbox.wrap(command, writable=writable, readable=readable, env=env, chdir=run_dir,
                            network=network or kind == "serve" or bool(getattr(cfg, "needs_network", bool)()),
                            share_pids=bool(getattr(cfg, "consumer", "")))

    def sandbox_inputs(self, run_dir: Path, cfg: TrainConfig | JobSpec, env: dict[str, str]) -> list[Path]:
        """More folders a subclass's worker reads (none for the real one: its config names all it reads)."""
        return []

    def start(self, run_dir: Path, cfg: TrainConfig | JobSpec) -> LocalHandle:
        proc = self.spawn(run_dir, cfg)
        # None: it died at once; the pump reports its exit and log
        return LocalHandle(proc.pid, started_at(proc.pid), proc, sandboxed=sandbox.is_wrapped(proc.args))

    def adopt(self, run: RunRecord) -> LocalHandle:
        return LocalHandle(run.pid, run.pid_started_at)


def pid_alive(pid: int | None, started_at: float | None) -> bool:
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if started_at and abs(proc.create_time() - started_at) > 1.0:
            return False  # the pid was reused by another process
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def started_at(pid: int) -> float | None:
    """When process ``pid`` started (what tells it from a later process given the same pid); None if gone."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None


def signal_group(pid: int | None, sig: signal.Signals) -> None:
    if not pid:
        return
    # torchrun starts each rank in a session of its own: a SIGTERM reaches them through the launcher, which
    # stops its ranks; a SIGKILL leaves it no chance, so the ranks are killed by pid as well.
    ranks = _descendants(pid) if sig == signal.SIGKILL else []
    try:
        os.killpg(pid, sig)  # the worker leads its own session/process group
    except (ProcessLookupError, PermissionError):
        pass
    for proc in ranks:
        try:
            proc.send_signal(sig)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (often the out-of-memory killer)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {code}"
