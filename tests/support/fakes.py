"""The fake worker's side of the tests: ``FakeLauncher`` (the real launcher starting tests/support/fake_worker.py in
place of the training worker), ``fake()`` to script its behaviour, and waiting for a run's step. With these a test
drives the real orchestrator, pump and store in a fraction of a second, without the ML stack."""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.support.env import wait_until
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.jobs.launcher import WorkerLauncher
from trainer_core.jobs.orchestrator import Orchestrator

FAKE_WORKER = Path(__file__).with_name("fake_worker.py")


class FakeLauncher(WorkerLauncher):
    """The real launcher (environment, own session, the run folder as cwd, worker.log) starting a fake worker
    in place of ``-m trainer_core.worker`` (or torchrun's ``-m trainer_core.worker.launch``), so a test drives
    the real orchestrator without the ML stack: ``Orchestrator(store, launcher=FakeLauncher())``.

    ``worker`` is a script (default tests/support/fake_worker.py) or Python source; it gets the run folder as its
    argument and the worker's environment. ``commands`` holds the real commands the orchestrator asked for,
    ``spawned`` the processes started."""

    def __init__(self, worker: Path | str = FAKE_WORKER):
        self.worker = worker
        self.commands: list[list[str]] = []
        self.spawned: list[subprocess.Popen] = []

    def command(self, run_dir: Path, processes: int) -> list[str]:
        real = super().command(run_dir, processes)
        assert real[1:2] == ["-m"] and real[2] in ("trainer_core.worker", "trainer_core.worker.launch"), \
            f"unexpected worker command {real}"
        self.commands.append(real)
        program = [str(self.worker)] if isinstance(self.worker, Path) else ["-c", self.worker]
        return [real[0], *program, *real[3:]]

    def environment(self, run_dir: Path, cfg, processes: int) -> dict[str, str]:
        env = super().environment(run_dir, cfg, processes)
        # The fake's behaviour (FAKE_*), which the real launcher's allow-list rightly does not pass on.
        env.update({k: v for k, v in os.environ.items() if k.startswith("FAKE_")})
        return env

    def sandbox_inputs(self, run_dir: Path, cfg, env: dict[str, str]) -> list[Path]:
        # the files a test scripts the fake with (FAKE_PAUSE_UNTIL's marker) lie in its tmp_path: shown read-only
        return [Path(env["FAKE_PAUSE_UNTIL"]).parent] if env.get("FAKE_PAUSE_UNTIL", "").startswith("/") else []

    def spawn(self, run_dir: Path, cfg: TrainConfig) -> subprocess.Popen:
        proc = super().spawn(run_dir, cfg)
        self.spawned.append(proc)
        return proc

    def kill_all(self) -> None:
        """Workers live in their own session on purpose: end (and reap) what a failed test left running."""
        for proc in self.spawned:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=10)


FAKE_OPTIONS = ("nan_step", "evals", "checkpoints", "linger")


def fake(monkeypatch, mode: str = "train", steps: int = 5, delay: float = 0.0, **options: str) -> TrainConfig:
    """Choose the fake's behaviour for the next start() (options left out take the script's defaults);
    returns a matching valid config."""
    assert set(options) <= set(FAKE_OPTIONS), options
    monkeypatch.setenv("FAKE_LOSSES", "scripted")
    monkeypatch.setenv("FAKE_MODE", mode)
    monkeypatch.setenv("FAKE_STEPS", str(steps))
    monkeypatch.setenv("FAKE_DELAY", str(delay))
    for name in FAKE_OPTIONS:
        if name in options:
            monkeypatch.setenv(f"FAKE_{name.upper()}", options[name])
        else:
            monkeypatch.delenv(f"FAKE_{name.upper()}", raising=False)
    return TrainConfig(model_name=BUNDLED_MODEL, run_name=f"fake {mode}", max_steps=steps)


def wait_for_step(orch: Orchestrator, run_id: str, step: int) -> None:
    def reached() -> bool:
        snap = orch.snapshot(run_id)
        assert not snap.status.is_terminal(), f"run ended early: {snap.status} {snap.error}\n{orch.log_tail(run_id)}"
        return snap.step >= step
    wait_until(reached, what=f"step {step} of {run_id}")
