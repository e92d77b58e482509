"""Where the tests run and how they reach a second interpreter: the checkout's root, the shared caches under
.test-cache, a child Python on the checkout's code, and the one wait helper. Anything touching torch runs in a child
process, because the test process plays the dashboard server, which must never import the ML stack."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Shared by every test that trains or previews for real: the bundled GGUF is converted, and the tiny
# model built, once per checkout.
MODELS_CACHE = ROOT / ".test-cache" / "models"
TINY_MODEL = ROOT / ".test-cache" / "tiny-llama"


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


def wait_until(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    """The one wait helper: poll ``predicate`` until it holds (wait for a condition, never for a state that a
    busy machine can skip past, and never sleep for a fixed time instead)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
