"""Helpers for tests that train for real. Anything touching torch runs in a subprocess, because
the test process plays the dashboard server, which must never import the ML stack."""
from __future__ import annotations

import contextlib
import fcntl
import functools
import inspect
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from db.entities import RunRecord
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.jobs.launcher import WorkerLauncher
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus

ROOT = Path(__file__).resolve().parents[1]
FAKE_WORKER = Path(__file__).with_name("fake_worker.py")
# Shared by every test that trains or previews for real: the bundled GGUF is converted, and the tiny
# model built, once per checkout.
MODELS_CACHE = ROOT / ".test-cache" / "models"
TINY_MODEL = ROOT / ".test-cache" / "tiny-llama"

BUILD_TINY = textwrap.dedent("""
    import sys
    from pathlib import Path
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trainer_core.host import hardware
    from trainer_core.worker import model_files
    from trainer_core.protocol import paths
    import torch

    target = Path(sys.argv[1])
    bundled = model_files.convert_gguf(hardware.bundled_gguf_path(), paths.models_dir() / "SmolLM2-135M-Instruct")
    tokenizer = AutoTokenizer.from_pretrained(bundled)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    print("ok", target)
""")


def run_python(code: str, *args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    merged = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=merged,
                          timeout=timeout, cwd=ROOT)


def run_in_child(function, *args: str, timeout: int = 900) -> str:
    """Run a module-level test function (its asserts included) in a fresh interpreter and return its output.

    For tests that must import the ML stack themselves: torch imported into the pytest process would make every
    later "the dashboard never imported torch" assertion of the session fail (or pass for the wrong reason)."""
    # by file: pytest imports test modules by basename (tests/ folders are not packages)
    code = ("import importlib.util, sys\n"
            "spec = importlib.util.spec_from_file_location('child_test', sys.argv[1])\n"
            "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
            "getattr(module, sys.argv[2])(*sys.argv[3:])\n")
    result = run_python(code, inspect.getfile(function), function.__name__, *args, timeout=timeout)
    assert result.returncode == 0, f"{function.__name__} failed in its child process:\n{result.stderr[-4000:]}"
    return result.stdout


@contextlib.contextmanager
def cache_lock(target: Path):
    """Parallel test workers (pytest-xdist) share .test-cache: one builds a cached model while the others wait."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.build-lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def built_once(build):
    """A builder of a cached model under ``cache_lock`` of its ``target``: its own check for a finished folder runs
    inside the lock, so a worker never takes a folder another is still writing."""
    signature = inspect.signature(build)

    @functools.wraps(build)
    def locked(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        with cache_lock(Path(bound.arguments["target"])):
            return build(*args, **kwargs)
    return locked


@built_once
def build_tiny_model(target: Path = TINY_MODEL, models_cache: Path = MODELS_CACHE) -> Path:
    """A 2-layer Llama with the bundled SmolLM2 tokenizer: real training, a fraction of a second per step."""
    if (target / "config.json").exists():
        return target
    result = run_python(BUILD_TINY, str(target), env={"FINETUNE_STUDIO_MODELS": str(models_cache)})
    assert result.returncode == 0, result.stderr[-3000:]
    return target


CONVERT_BUNDLED = textwrap.dedent("""
    import sys
    from pathlib import Path
    from trainer_core.host import hardware
    from trainer_core.worker import model_files

    model_files.convert_gguf(hardware.bundled_gguf_path(), Path(sys.argv[1]))
""")


def bundled_model_folder() -> Path:
    """The converted bundled model in the test models cache, converted now (once) when a fresh clone has none yet.
    For tests that load it directly rather than through a worker, which converts it itself (under its own lock)."""
    folder = MODELS_CACHE / "SmolLM2-135M-Instruct"
    if not (folder / "config.json").exists():
        result = run_python(CONVERT_BUNDLED, str(folder))  # model_files.convert_gguf locks and writes atomically
        assert result.returncode == 0, result.stderr[-3000:]
    return folder


class FakeLauncher(WorkerLauncher):
    """The real launcher (environment, own session, the run folder as cwd, worker.log) starting a fake worker
    in place of ``-m trainer_core.worker`` (or torchrun's ``-m trainer_core.worker.launch``), so a test drives
    the real orchestrator without the ML stack: ``Orchestrator(store, launcher=FakeLauncher())``.

    ``worker`` is a script (default tests/fake_worker.py) or Python source; it gets the run folder as its
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


def wait_until(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    """The one wait helper: poll ``predicate`` until it holds (wait for a condition, never for a state that a
    busy machine can skip past, and never sleep for a fixed time instead)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_for_step(orch: Orchestrator, run_id: str, step: int) -> None:
    def reached() -> bool:
        snap = orch.snapshot(run_id)
        assert not snap.status.is_terminal(), f"run ended early: {snap.status} {snap.error}\n{orch.log_tail(run_id)}"
        return snap.step >= step
    wait_until(reached, what=f"step {step} of {run_id}")


def orphan_run(store, status: str = RunStatus.RUNNING.value, pid: int | None = None,
            pid_started_at: float | None = None, make_dir: bool = True) -> str:
    """A run the database says is active, with no orchestrator following it (a server that went away)."""
    run_id = f"orphan-{os.getpid()}-{time.monotonic_ns()}"
    if make_dir:
        paths.run_dir(run_id).mkdir(parents=True)
    store.create_run(RunRecord(id=run_id, name="orphan", status=status, created_at=time.time(), started_at=time.time(),
                         output_dir=str(paths.run_dir(run_id)), pid=pid, pid_started_at=pid_started_at,
                         total_steps=10))
    return run_id
