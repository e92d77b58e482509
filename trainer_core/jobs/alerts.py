"""Training-health alerts from metric rows: non-finite loss or grad norm, grad-norm spikes, rising eval loss.

Pure and incremental: the pump feeds each metric row to one ``AlertMonitor`` per run; ``replay`` runs
the same rules over stored rows (e.g. after a server restart). The rules, exactly:

* ``nonfinite_loss`` / ``nonfinite_grad_norm``: the value is NaN/inf, or its name is listed in the row's
  ``nonfinite`` field (the event log stores non-finite numbers as None plus that name). One alert per
  episode: it fires again only after a finite value of that metric was seen in between.
* ``grad_spike``: a finite grad norm above ``spike_factor`` x the median of the previous
  ``spike_window`` finite grad norms, once at least ``min_history`` of them exist. One alert per run of
  consecutive spiking steps. Every finite grad norm (spikes too) enters the history.
* ``eval_rising``: eval loss strictly above the previous evaluation ``eval_patience`` times in a row,
  i.e. on the (patience + 1)-th evaluation of a rising streak; once per streak (a value that is not
  higher ends it). Non-finite eval losses are ignored.

* GRPO (open metrics, so they apply to any run that logs these keys): ``no_learning_signal`` when
  ``frac_reward_zero_std`` is at least ``zero_spread_share`` on ``grpo_patience`` steps in a row (groups whose
  completions all score the same teach nothing); ``always_clipped`` when ``completions/clipped_ratio`` is at
  least ``clipped_share`` on ``grpo_patience`` steps in a row (answers never finish: raise
  max_completion_length); ``length_collapse`` when ``completions/mean_length`` has fallen to at most
  ``collapse_share`` of its first value (and below ``collapse_tokens``) while ``reward`` is above its first
  value (a reward without a length term being gamed by ever shorter answers). Once per streak; the collapse
  once per run.

* ``sample_empty`` / ``sample_repetition`` / ``sample_template_leak`` (``SampleAlerts``): a sample answer taken
  during training was flagged degenerate (``trainer_core.evaluation.samples_check``); once per kind per run.

* ``no_step`` is not a rule on rows but on time: the pump raises it when a run training has reported no new step
  for ``FINETUNE_STUDIO_STALL_MINUTES`` while its worker lives (trainer_core/jobs/adoption.py, ``notice_stall``).

Each metric of a step is taken once: a field is only read from a row whose step is later than the last
step that field was read at, so a train row and an eval row of one step, or a row sent twice, never
count twice. Missing values are None (use ``rows_from_frame`` for DataFrames, where missing is NaN).
"""
from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from trainer_core.evaluation import samples_check

NONFINITE_LOSS = "nonfinite_loss"
NONFINITE_GRAD_NORM = "nonfinite_grad_norm"
GRAD_SPIKE = "grad_spike"
EVAL_RISING = "eval_rising"
NO_LEARNING_SIGNAL = "no_learning_signal"
ALWAYS_CLIPPED = "always_clipped"
LENGTH_COLLAPSE = "length_collapse"
NO_STEP = "no_step"
KINDS = (NONFINITE_LOSS, NONFINITE_GRAD_NORM, GRAD_SPIKE, EVAL_RISING, NO_LEARNING_SIGNAL, ALWAYS_CLIPPED,
         LENGTH_COLLAPSE, NO_STEP)
LABELS = {NONFINITE_LOSS: "non-finite loss", NONFINITE_GRAD_NORM: "non-finite grad norm",
          GRAD_SPIKE: "grad-norm spike", EVAL_RISING: "eval loss rising",
          NO_LEARNING_SIGNAL: "no learning signal (GRPO)", ALWAYS_CLIPPED: "completions always clipped (GRPO)",
          LENGTH_COLLAPSE: "reward rising while completions collapse (GRPO)", NO_STEP: "no new step"}


@dataclass(frozen=True)
class Alert:
    kind: str      # one of KINDS
    step: int
    message: str   # names the value, e.g. "Grad norm 84.2 at step 310 is 21.1x its recent median (4)."


def _num(value: float) -> str:
    return f"{value:.4g}"


def _nonfinite_names(row: dict[str, Any]) -> set[str]:
    names = row.get("nonfinite") or ""
    if isinstance(names, str):
        return {n.strip() for n in names.split(",") if n.strip()}
    return set(names)  # a dict or list of names, as events carry them


def _read(row: dict[str, Any], name: str, nonfinite: set[str]) -> tuple[bool, float | None]:
    """(present, finite value or None when non-finite) of one metric in a row."""
    value = row.get(name)
    if name in nonfinite:
        return True, None
    if value is None:
        return False, None
    value = float(value)
    return True, value if math.isfinite(value) else None


def _describe(row: dict[str, Any], name: str) -> str:
    value = row.get(name)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return "NaN or inf"


class AlertMonitor:
    """The alert rules of one run, fed one metric row at a time (see the module docstring)."""

    def __init__(self, spike_factor: float = 10.0, spike_window: int = 50, min_history: int = 10,
                 eval_patience: int = 3, grpo_patience: int = 5, zero_spread_share: float = 0.9,
                 clipped_share: float = 0.99, collapse_share: float = 0.1, collapse_tokens: float = 3.0):
        if spike_factor <= 1 or spike_window < 1 or not 1 <= min_history <= spike_window or eval_patience < 1:
            raise ValueError("need spike_factor > 1, spike_window >= 1, 1 <= min_history <= spike_window "
                             f"and eval_patience >= 1; got {spike_factor}, {spike_window}, {min_history}, "
                             f"{eval_patience}")
        self.spike_factor = spike_factor
        self.min_history = min_history
        self.eval_patience = eval_patience
        self._last_step: dict[str, int] = {}        # metric -> last step it was read at
        self._in_episode: set[str] = set()          # non-finite kinds alerted and not yet finite again
        self._grads: deque[float] = deque()        # the last spike_window finite grad norms, oldest first
        self._sorted_grads: list[float] = []        # the same values in order: the median without a sort per row
        self.spike_window = spike_window
        self._spiking = False
        self._evals: list[tuple[int, float]] = []   # the current rising streak, starting at its low point
        self._streak_alerted = False
        self.grpo_patience = grpo_patience
        self.zero_spread_share, self.clipped_share = zero_spread_share, clipped_share
        self.collapse_share, self.collapse_tokens = collapse_share, collapse_tokens
        self._streaks: dict[str, int] = {}          # GRPO streak kind -> steps in a row so far (-1: alerted)
        self._streak_low: dict[str, float] = {}     # GRPO streak kind -> the lowest share in the streak so far
        self._first: dict[str, float] = {}          # reward / mean length at their first step
        self._collapsed = False

    def observe(self, row: dict[str, Any]) -> list[Alert]:
        """The alerts this row raises (usually none)."""
        step = int(row["step"])
        alerts: list[Alert] = []
        nonfinite = _nonfinite_names(row) if row.get("nonfinite") else set()
        for name, check in (("loss", self._loss), ("grad_norm", self._grad_norm), ("eval_loss", self._eval_loss)):
            present, value = _read(row, name, nonfinite)
            if not present or step <= self._last_step.get(name, -math.inf):
                continue
            self._last_step[name] = step
            alert = check(step, value, row)
            if alert:
                alerts.append(alert)
        if "reward" in row or "frac_reward_zero_std" in row or "completions/clipped_ratio" in row:
            alerts += self._grpo(step, row, nonfinite)
        return alerts

    def _grpo(self, step: int, row: dict[str, Any], nonfinite: set[str]) -> list[Alert]:
        if step <= self._last_step.get("grpo", -math.inf):
            return []
        self._last_step["grpo"] = step
        alerts = []
        nonfinite = {name.removeprefix("metrics.") for name in nonfinite}  # open metrics are named metrics.<key>
        for kind, key, share, text in (
                (NO_LEARNING_SIGNAL, "frac_reward_zero_std", self.zero_spread_share,
                 "of the groups had no reward spread (every completion scored the same): they teach nothing. "
                 "Make the rewards finer, raise temperature or num_generations, or use easier prompts."),
                (ALWAYS_CLIPPED, "completions/clipped_ratio", self.clipped_share,
                 "of the completions were cut at max_completion_length: answers never finish. Raise "
                 "grpo.max_completion_length or reward shorter answers.")):
            present, value = _read(row, key, nonfinite)
            if not present:
                continue
            if value is None or value < share:
                self._streaks[kind] = 0
                continue
            if self._streaks.get(kind, 0) < 0:
                continue  # this streak was alerted on
            self._streaks[kind] = self._streaks.get(kind, 0) + 1
            low = self._streak_low[kind] = value if self._streaks[kind] == 1 else min(self._streak_low[kind], value)
            if self._streaks[kind] >= self.grpo_patience:
                self._streaks[kind] = -1
                # the share every step of the streak reached (the last step's alone could overstate the others)
                alerts.append(Alert(kind, step, f"For {self.grpo_patience} steps in a row (to step {step}), at least "
                                                f"{low:.0%} {text}"))
        reward = _read(row, "reward", nonfinite)[1]
        length = _read(row, "completions/mean_length", nonfinite)[1]
        if reward is not None and length is not None:
            self._first.setdefault("reward", reward)
            first_length = self._first.setdefault("length", length)
            if (not self._collapsed and reward > self._first["reward"] and length <= self.collapse_tokens
                    and length <= self.collapse_share * first_length):
                self._collapsed = True
                alerts.append(Alert(LENGTH_COLLAPSE, step, f"Reward rose from {_num(self._first['reward'])} to "
                                    f"{_num(reward)} while completions shrank from {_num(first_length)} to "
                                    f"{_num(length)} tokens (step {step}): a reward without a length term may be "
                                    "gamed by ever shorter answers; add a length or format reward."))
        return alerts

    def replay(self, rows: Iterable[dict[str, Any]]) -> list[Alert]:
        """Observe every row in order and return all alerts raised."""
        return [alert for row in rows for alert in self.observe(row)]

    def _nonfinite(self, kind: str, step: int, value: float | None, row: dict[str, Any], name: str,
                   label: str) -> Alert | None:
        if value is not None:
            self._in_episode.discard(kind)
            return None
        if kind in self._in_episode:
            return None
        self._in_episode.add(kind)
        return Alert(kind, step, f"{label} is {_describe(row, name)} at step {step}.")  # text only when raised

    def _loss(self, step: int, value: float | None, row: dict[str, Any]) -> Alert | None:
        return self._nonfinite(NONFINITE_LOSS, step, value, row, "loss", "Train loss")

    def _grad_norm(self, step: int, value: float | None, row: dict[str, Any]) -> Alert | None:
        alert = self._nonfinite(NONFINITE_GRAD_NORM, step, value, row, "grad_norm", "Grad norm")
        if value is None:
            return alert
        spike = None
        if len(self._grads) >= self.min_history:
            median = _median(self._sorted_grads)
            if median > 0 and value > self.spike_factor * median:
                if not self._spiking:
                    spike = Alert(GRAD_SPIKE, step, f"Grad norm {_num(value)} at step {step} is "
                                                    f"{value / median:.3g}x its recent median ({_num(median)}).")
                self._spiking = True
            else:
                self._spiking = False
        self._grads.append(value)
        bisect.insort(self._sorted_grads, value)
        if len(self._grads) > self.spike_window:
            oldest = self._grads.popleft()
            del self._sorted_grads[bisect.bisect_left(self._sorted_grads, oldest)]
        return spike

    def _eval_loss(self, step: int, value: float | None, row: dict[str, Any]) -> Alert | None:
        if value is None:
            return None
        if self._evals and value > self._evals[-1][1]:
            self._evals.append((step, value))
        else:
            self._evals = [(step, value)]
            self._streak_alerted = False
        rises = len(self._evals) - 1
        if rises < self.eval_patience or self._streak_alerted:
            return None
        self._streak_alerted = True
        start_step, start = self._evals[0]
        return Alert(EVAL_RISING, step, f"Eval loss rose {rises} evaluations in a row: {_num(start)} at step "
                                        f"{start_step} to {_num(value)} at step {step}.")


def _median(ordered: list[float]) -> float:
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def replay(rows: Iterable[dict[str, Any]], **settings: Any) -> list[Alert]:
    """All alerts a fresh ``AlertMonitor(**settings)`` raises over ``rows``."""
    return AlertMonitor(**settings).replay(rows)


def rows_from_frame(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Metric rows of a DataFrame with missing values as None (a NaN cell is a gap, not a NaN loss)."""
    return df.astype(object).where(df.notna(), None).to_dict("records")


# ---------------------------------------------------------------------- samples during training
# Degenerate sample answers (the worker finds them with trainer_core.evaluation.samples_check and sends them as a
# sample event's flags): one alert per kind per run, at the first sample that shows it.
SAMPLE_EMPTY = "sample_empty"
SAMPLE_REPETITION = "sample_repetition"
SAMPLE_TEMPLATE_LEAK = "sample_template_leak"
SAMPLE_KINDS = {samples_check.EMPTY: SAMPLE_EMPTY, samples_check.REPETITION: SAMPLE_REPETITION,
                samples_check.TEMPLATE_LEAK: SAMPLE_TEMPLATE_LEAK}
KINDS += tuple(SAMPLE_KINDS.values())
LABELS.update({SAMPLE_EMPTY: "empty sample answer", SAMPLE_REPETITION: "sample answer loops",
               SAMPLE_TEMPLATE_LEAK: "chat-template tokens in a sample answer"})
_SAMPLE_TEXT = {SAMPLE_EMPTY: "is empty", SAMPLE_REPETITION: "loops", SAMPLE_TEMPLATE_LEAK: "leaks template tokens"}


class SampleAlerts:
    """The degeneration rules of one run's sample answers, fed one sample at a time."""

    def __init__(self) -> None:
        self._raised: set[str] = set()

    def observe(self, step: int, index: int, flags: dict[str, Any]) -> list[Alert]:
        """Alerts for the flag kinds this run has not alerted on yet (flags of unknown kinds are ignored)."""
        alerts = []
        for flag, detail in flags.items():
            kind = SAMPLE_KINDS.get(flag)
            if kind is None or kind in self._raised:
                continue
            self._raised.add(kind)
            detail = str(detail)[:200]
            alerts.append(Alert(kind, step, f"Sample answer {index + 1} at step {step} {_SAMPLE_TEXT[kind]}"
                                            + (f": {detail}." if detail else ".")))
        return alerts
