"""Every call of a GRPO reward function guarded, in the worker and in the reward check's child.

TRL's GRPOTrainer turns what a reward returns straight into a tensor: a list of strings failed the run with
"too many dimensions 'str'", an inf score made every advantage NaN (loss and grad norm 0.0 for the rest of a run
that still "completed"), a reward scoring nothing was dropped without a word, and ``sys.exit``/``os._exit`` in a
reward ended the worker naming nothing. ``guard`` wraps one reward so that:

* what it raises or returns wrong becomes a ``RewardError`` naming the reward, the fault and the fix (and the line
  of the reward's own file), which the worker reports as the run's error; ``SystemExit``, ``KeyboardInterrupt``,
  ``MemoryError`` and ``os._exit`` (trapped while a reward runs, in the thread that runs it) included;
* NaN/inf scores are left out (None, which TRL leaves out of the sum) with one warning per reward, and once they
  are more than ``NON_FINITE_SHARE`` of the reward's scores so far, the run stops naming it;
* a call that scores no completion is one warning per reward; a reward that scored none in its first
  ``EMPTY_CALLS`` calls stops the run (a reward scoring only some rows, e.g. math rows, is fine);
* a call that runs longer than ``FINETUNE_STUDIO_REWARD_TIMEOUT_S`` (default 120 s; it scores a whole batch) is
  ended and stops the run naming the reward, instead of holding the step, the device and the queue for ever
  (a SIGALRM timer, so in the main thread only, where TRL calls rewards; elsewhere the stall alert and Stop remain).

``guard_tool`` wraps a GRPO tool the same way, except that a fault is the tool's result, not the run's end: what a call
raises, an exit or a hang past ``FINETUNE_STUDIO_TOOL_TIMEOUT_S`` becomes a ``ToolError`` naming the tool, which TRL's
tool loop gives the model as an error result; the first of each fault per tool is one warning.

Pure Python: no ML import, so the dashboard's tests use it as it is.
"""
from __future__ import annotations

import functools
import math
import numbers
import os
import signal
import threading
import traceback
from typing import Any, Callable

NON_FINITE_SHARE = 0.5  # past this share of a reward's scores so far, NaN/inf scores stop the run
EMPTY_CALLS = 3  # calls in a row, from the first, that score no completion: the reward is broken, not selective
_ENDS = "a reward returns its scores and never ends the worker"
TIMEOUT_ENV = "FINETUNE_STUDIO_REWARD_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 120.0


class RewardError(RuntimeError):
    """A reward misbehaved. ``reason`` is the fault and the fix without the reward's name (the reward check shows
    it in the reward's own row); ``str()`` names the reward."""

    def __init__(self, name: str, reason: str, where: str = ""):
        self.name, self.reason = name, reason
        super().__init__(f"reward '{name}' {reason}" + (f" (at {where})" if where else ""))


class _ExitCalled(BaseException):
    """os._exit called from a reward: raised instead of ending the process (a BaseException, so that the
    reward's own ``except Exception`` cannot swallow it)."""

    def __init__(self, code: Any):
        super().__init__(code)
        self.code = code


_inside = threading.local()  # .reward: the name of the reward running in this thread, if any
_real_exit = os._exit


def _trapped_exit(code: int) -> None:
    if getattr(_inside, "reward", None) is not None:
        raise _ExitCalled(code)
    _real_exit(code)


class _TimedOut(BaseException):
    """The reward call ran past its time limit (a BaseException: the reward's ``except Exception`` cannot hold it)."""


def time_limit() -> float:
    """Seconds one reward call may take (0: no limit)."""
    try:
        value = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if math.isfinite(value) and value > 0 else 0.0


def _on_alarm(signum, frame) -> None:
    raise _TimedOut()


def trap_exit() -> None:
    """Install the os._exit trap (idempotent; every other caller and thread still gets the real one). Call it
    before loading a reward module, so that ``from os import _exit`` there binds the trap."""
    os._exit = _trapped_exit


def guard(fn: Callable, name: str, warn: Callable[[str], None]) -> Callable:
    """``fn`` as TRL calls it, named ``name`` (TRL logs ``rewards/<name>/mean``), with every call checked."""
    trap_exit()
    return _Guarded(fn, name, warn)


def run_reward(name: str, fn: Callable, *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)`` as reward ``name``'s code (a call, or loading its module): whatever it raises, exit
    included, comes out as a RewardError naming the reward."""
    _inside.reward = name
    limit = time_limit() if threading.current_thread() is threading.main_thread() else 0.0
    previous = signal.signal(signal.SIGALRM, _on_alarm) if limit else None
    if limit:
        signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        return fn(*args, **kwargs)
    except _TimedOut:
        raise RewardError(name, f"took longer than {limit:g} s for one call and was ended: make it faster (it scores a "
                                f"whole batch of completions at once), or raise {TIMEOUT_ENV}") from None
    except _ExitCalled as exc:
        raise RewardError(name, f"called os._exit({exc.code}): {_ENDS}", _where(exc)) from None
    except SystemExit as exc:
        raise RewardError(name, f"called sys.exit({exc.code}): {_ENDS}", _where(exc)) from exc
    except KeyboardInterrupt as exc:
        raise RewardError(name, f"was interrupted (KeyboardInterrupt): {_ENDS}", _where(exc)) from exc
    except MemoryError as exc:  # worded apart from the trainer's out-of-memory advice: the reward asked, not the model
        raise RewardError(name, "raised MemoryError: it asked for more memory than the host has; make it use less (it "
                                "scores a whole batch of completions at once)", _where(exc)) from exc
    except Exception as exc:  # noqa: BLE001 - user code: whatever it raises is the reward's fault, named
        raise RewardError(name, f"raised {type(exc).__name__}: {str(exc)[:500]}", _where(exc)) from exc
    finally:
        if limit:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        _inside.reward = None


class _Guarded:
    def __init__(self, fn: Callable, name: str, warn: Callable[[str], None]):
        self.fn, self.__name__, self.warn = fn, name, warn
        self.calls = self.scores = self.non_finite = self.scored = 0
        self.warned: set[str] = set()

    def __call__(self, prompts, completions, **kwargs) -> list[float | None]:
        returned = self._run(prompts, completions, **kwargs)
        scores = self._scores(returned, len(completions))
        state = kwargs.get("trainer_state")
        at = f" at step {state.global_step + 1}" if getattr(state, "global_step", None) is not None else ""
        self._count(scores, at)
        return [value if value is None or math.isfinite(value) else None for value in scores]

    def _run(self, prompts, completions, **kwargs) -> Any:
        return run_reward(self.__name__, self.fn, prompts, completions, **kwargs)

    def _scores(self, returned: Any, expected: int) -> list[float | None]:
        if hasattr(returned, "tolist") and not isinstance(returned, (str, bytes)):
            returned = returned.tolist()  # a numpy array or a tensor
        if not isinstance(returned, (list, tuple)):
            raise self._error(f"returned a {type(returned).__name__}, not a list: return one score per completion "
                              f"({expected} here)")
        if len(returned) != expected:
            raise self._error(f"returned {len(returned)} scores for {expected} completions: return one per completion "
                              "(None for one it does not score)")
        for index, value in enumerate(returned):
            if value is not None and not isinstance(value, numbers.Real):
                raise self._error(f"returned a {type(value).__name__} ({str(value)[:40]!r}) for completion {index}: "
                                  "each score is a float, or None for a completion it does not score")
        return [None if value is None else float(value) for value in returned]

    def _count(self, scores: list[float | None], at: str) -> None:
        bad = [value for value in scores if value is not None and not math.isfinite(value)]
        self.calls += 1
        self.scores += len(scores)
        self.non_finite += len(bad)
        self.scored += len(scores) - len(bad) - scores.count(None)
        if self.non_finite > NON_FINITE_SHARE * self.scores:
            raise self._error(f"returned non-finite scores (NaN or inf) for {self.non_finite} of its {self.scores} "
                              f"scores so far, more than half: make it return finite floats (None for a completion "
                              "it does not score)")
        if bad:
            kinds = " and ".join(sorted({"NaN" if value != value else "inf" if value > 0 else "-inf" for value in bad}))
            self._warn_once("non-finite", f"returned {kinds} for {len(bad)} of {len(scores)} completions{at}: those "
                                          "scores are left out (as None) and training goes on; past half of its scores "
                                          "the run stops. Make it return finite floats (None for a completion it does "
                                          "not score).")
        if not self.scored and self.calls >= EMPTY_CALLS:
            raise self._error(f"scored no completion in its first {self.calls} calls (every score None): check its "
                              "parameters and the dataset columns it reads")
        if scores and all(value is None for value in scores):
            self._warn_once("none", f"scored none of the {len(scores)} completions{at} (every score None): it adds "
                                    "nothing to their reward. Check its parameters and the dataset columns it reads.")

    def _warn_once(self, kind: str, reason: str) -> None:
        if kind not in self.warned:
            self.warned.add(kind)
            self.warn(f"reward '{self.__name__}' {reason}")

    def _error(self, reason: str) -> RewardError:
        return RewardError(self.__name__, reason)


def _where(exc: BaseException) -> str:
    """The file and line in the reward's own code where ``exc`` was raised ("" inside trainer_core only)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not os.path.abspath(f.filename).startswith(here)]
    return f"{frames[-1].filename} line {frames[-1].lineno}" if frames else ""


# ---------------------------------------------------------------------- tools
TOOL_TIMEOUT_ENV = "FINETUNE_STUDIO_TOOL_TIMEOUT_S"
DEFAULT_TOOL_TIMEOUT_S = 30.0


class ToolError(Exception):
    """A tool call failed (raised, exited, hung). An ``Exception``: TRL's tool loop catches it, gives the model
    ``{"error": <this message>}`` as the tool's result, counts it in ``tools/failure_frequency`` and goes on.
    ``where``: the line of the tool's own file, for the warning (the model's context gets no host paths)."""

    def __init__(self, message: str, where: str = ""):
        super().__init__(message)
        self.where = where


def tool_time_limit() -> float:
    """Seconds one tool call may take (0: no limit)."""
    try:
        value = float(os.environ.get(TOOL_TIMEOUT_ENV, DEFAULT_TOOL_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TOOL_TIMEOUT_S
    return value if math.isfinite(value) and value > 0 else 0.0


def guard_tool(fn: Callable, name: str, warn: Callable[[str], None]) -> Callable:
    """``fn`` as TRL calls it during rollouts: its name, signature and docstring kept (transformers builds the
    schema the model sees from them); a call that raises, exits or runs past ``tool_time_limit()`` becomes a
    ToolError naming the tool, and the first fault of each kind per tool is one warning."""
    trap_exit()
    warned: set[str] = set()

    @functools.wraps(fn)
    def tool(*args, **kwargs):
        try:
            return _call_tool(name, fn, args, kwargs)
        except ToolError as exc:
            kind = str(exc).split(":", 1)[0]
            if kind not in warned:
                warned.add(kind)
                warn(f"{exc}{f' (at {exc.where})' if exc.where else ''}. The model got this error as the tool's "
                     "result and training goes on; fix the tool (tools/failure_frequency counts failed calls).")
            raise

    return tool


def _call_tool(name: str, fn: Callable, args: tuple, kwargs: dict) -> Any:
    _inside.reward = name
    limit = tool_time_limit() if threading.current_thread() is threading.main_thread() else 0.0
    previous = signal.signal(signal.SIGALRM, _on_alarm) if limit else None
    if limit:
        signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        return fn(*args, **kwargs)
    except _TimedOut:
        raise ToolError(f"tool '{name}' took longer than {limit:g} s: it was ended (raise {TOOL_TIMEOUT_ENV} if it "
                        "needs longer)") from None
    except _ExitCalled as exc:
        raise ToolError(f"tool '{name}' called os._exit({exc.code}): a tool returns its result and never ends the "
                        "worker", _where(exc)) from None
    except SystemExit as exc:
        raise ToolError(f"tool '{name}' called sys.exit({exc.code}): a tool returns its result and never ends the "
                        "worker", _where(exc)) from None
    except Exception as exc:  # noqa: BLE001 - user code: whatever it raises is the tool's fault, named
        raise ToolError(f"tool '{name}' raised {type(exc).__name__}: {str(exc)[:300]}", _where(exc)) from None
    finally:
        if limit:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        _inside.reward = None

