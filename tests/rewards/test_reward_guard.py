"""Every reward call is guarded (issue 31): a reward that returns the wrong thing, raises, exits or runs out of memory
stops the run with an error that names it; non-finite scores are left out with a warning and, past half of a
reward's scores, stop the run naming it; a reward that scores nothing is a warning, then an error."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from tests.support import ROOT
from trainer_core.rewards import guard as guard_module
from trainer_core.rewards.guard import RewardError, guard

COMPLETIONS = ["a", "b", "c", "d"]


def call(fn, warnings=None, step=None, completions=COMPLETIONS):
    guarded = guard(fn, "mine", (warnings if warnings is not None else []).append)
    extra = {"trainer_state": SimpleNamespace(global_step=step)} if step is not None else {}
    return guarded(prompts=["p"] * len(completions), completions=completions, **extra)


def exits(*_, **__):
    sys.exit(3)


def hard_exits(*_, **__):
    os._exit(3)


def interrupted(*_, **__):
    raise KeyboardInterrupt


def hungry(*_, **__):
    raise MemoryError


def raises(*_, **__):
    raise ValueError("boom")


@pytest.mark.parametrize("fn,message", [
    (lambda p, c, **_: ["good"] * len(c),
     "reward 'mine' returned a str ('good') for completion 0: each score is a float, or None for a completion it "
     "does not score"),
    (lambda p, c, **_: 1.0,
     "reward 'mine' returned a float, not a list: return one score per completion (4 here)"),
    (lambda p, c, **_: "1.0",
     "reward 'mine' returned a str, not a list: return one score per completion (4 here)"),
    (lambda p, c, **_: [1.0, 0.0],
     "reward 'mine' returned 2 scores for 4 completions: return one per completion (None for one it does not score)"),
    (exits, "reward 'mine' called sys.exit(3): a reward returns its scores and never ends the worker"),
    (hard_exits, "reward 'mine' called os._exit(3): a reward returns its scores and never ends the worker"),
    (interrupted, "reward 'mine' was interrupted (KeyboardInterrupt): a reward returns its scores and never ends "
                  "the worker"),
    (hungry, "reward 'mine' raised MemoryError: it asked for more memory than the host has; make it use less (it "
             "scores a whole batch of completions at once)"),
    (raises, "reward 'mine' raised ValueError: boom"),
])
def test_a_reward_that_misbehaves_is_named_with_the_fix(fn, message):
    with pytest.raises(RewardError) as caught:
        call(fn)
    assert str(caught.value).split(" (at ")[0] == message


def test_the_error_points_at_the_line_of_the_reward():
    with pytest.raises(RewardError) as caught:
        call(raises)
    assert str(caught.value).endswith(f"(at {__file__} line {raises.__code__.co_firstlineno + 1})")


def test_scores_come_back_as_floats_and_none_from_lists_arrays_and_numbers():
    assert call(lambda p, c, **_: np.array([1, 0, 0.5, 2], dtype=np.float32)) == [1.0, 0.0, 0.5, 2.0]
    assert call(lambda p, c, **_: (True, None, np.int64(3), 0)) == [1.0, None, 3.0, 0.0]


def test_a_few_non_finite_scores_are_left_out_with_one_warning():
    warnings: list[str] = []
    assert call(lambda p, c, **_: [1.0, float("inf"), 0.0, 1.0], warnings, step=6) == [1.0, None, 0.0, 1.0]
    assert warnings == ["reward 'mine' returned inf for 1 of 4 completions at step 7: those scores are left out (as "
                        "None) and training goes on; past half of its scores the run stops. Make it return finite "
                        "floats (None for a completion it does not score)."]
    guarded = guard(lambda p, c, **_: [float("nan"), 1.0, 1.0, 1.0], "again", warnings.append)
    guarded(["p"] * 4, COMPLETIONS)
    guarded(["p"] * 4, COMPLETIONS)
    assert len(warnings) == 2  # once per reward


def test_non_finite_scores_past_half_of_a_rewards_scores_stop_the_run_naming_it():
    warnings: list[str] = []
    scores = iter([[1.0, float("-inf"), 1.0, 1.0], [float("inf")] * 4])
    guarded = guard(lambda p, c, **_: next(scores), "mine", warnings.append)
    guarded(["p"] * 4, COMPLETIONS)  # 1 of 4: a warning
    with pytest.raises(RewardError) as caught:
        guarded(["p"] * 4, COMPLETIONS)  # 5 of 8: past half
    assert str(caught.value) == ("reward 'mine' returned non-finite scores (NaN or inf) for 5 of its 8 scores so far, "
                                 "more than half: make it return finite floats (None for a completion it does not "
                                 "score)")


def test_nan_for_every_completion_stops_the_run_at_once():
    with pytest.raises(RewardError, match=r"^reward 'mine' returned non-finite scores \(NaN or inf\) for 4 of its 4 "):
        call(lambda p, c, **_: [float("nan")] * len(c))


def test_a_reward_that_scores_nothing_warns_then_stops_the_run():
    warnings: list[str] = []
    guarded = guard(lambda p, c, **_: [None] * len(c), "mine", warnings.append)
    guarded(["p"] * 4, COMPLETIONS)
    guarded(["p"] * 4, COMPLETIONS)
    assert warnings == ["reward 'mine' scored none of the 4 completions (every score None): it adds nothing to their "
                        "reward. Check its parameters and the dataset columns it reads."]
    with pytest.raises(RewardError) as caught:
        guarded(["p"] * 4, COMPLETIONS)
    assert str(caught.value) == ("reward 'mine' scored no completion in its first 3 calls (every score None): check "
                                 "its parameters and the dataset columns it reads")


def test_a_reward_that_scores_some_rows_only_is_fine():
    warnings: list[str] = []
    guarded = guard(lambda p, c, **_: [1.0, None, None, None], "mine", warnings.append)
    for _ in range(5):
        assert guarded(["p"] * 4, COMPLETIONS) == [1.0, None, None, None]
    assert warnings == []


def test_the_guard_keeps_the_name_trl_logs_the_reward_under():
    assert guard(lambda p, c, **_: [], "format_2", print).__name__ == "format_2"


def test_os_exit_outside_a_reward_still_ends_the_process():
    script = ("import os\nfrom trainer_core.rewards.guard import RewardError, guard\n"
              "try:\n    guard(lambda p, c, **_: os._exit(3), 'mine', print)(['p'], ['c'])\n"
              "except RewardError as exc:\n    print(exc, flush=True)\nos._exit(5)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.split(" (at ")[0]) == (
        5, "reward 'mine' called os._exit(3): a reward returns its scores and never ends the worker")


def test_the_reward_checks_report_reads_non_finite_scores_and_alerts_without_a_traceback():
    from trainer_core.rewards.check import RewardCheck, RewardResult, report

    inf, nan = float("inf"), float("nan")
    result = RewardCheck((RewardResult("mine", "python", 1.0, (1.0, inf, nan, None), alerts=("reward 'mine' x",)),))
    assert report(result) == ["0 completions scored",
                              "mine (python, weight 1): mean 1, spread 0; scores [1, inf, nan, None]",
                              "warning: reward 'mine' x",
                              "warning: mine scored 2 completions NaN or inf: they are left out of training"]


def test_a_reward_call_that_never_ends_is_ended_naming_the_reward(monkeypatch):
    import time

    monkeypatch.setenv(guard_module.TIMEOUT_ENV, "0.5")

    def stuck(prompts, completions, **kwargs):
        try:
            time.sleep(3600)
        except Exception:  # noqa: BLE001 - a reward that swallows errors cannot hold the time limit either
            time.sleep(3600)
        return [1.0] * len(completions)

    with pytest.raises(RewardError, match=r"^reward 'stuck' took longer than 0.5 s for one call and was ended"):
        guard(stuck, "stuck", lambda message: None)(["p"], ["c"])
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # no timer left to fire later
    assert guard(lambda prompts, completions, **kw: [0.5], "quick", print)(["p"], ["c"]) == [0.5]
