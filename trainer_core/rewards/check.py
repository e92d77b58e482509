"""The reward check before start: each GRPO reward run on a few real rows, with the data's reference answers
and (optionally) a few base-model generations, in a subprocess (``worker.reward_check_child``): the
dashboard never imports the ML stack or the user's reward code. The form's "Check rewards" button and the
CLI's ``rewards check`` show what it finds: each reward's scores and spread, a reward that raises (with the
line), and a constant reward (a group whose completions all score the same teaches nothing)."""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainer_core.auth import access
from trainer_core.protocol import files, sandbox
from trainer_core.protocol.errors import FieldError

if TYPE_CHECKING:  # the run's settings, read by attribute: config sits above rewards (tests/test_layering.py)
    from trainer_core.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class RewardResult:
    name: str
    kind: str
    weight: float
    scores: tuple[float | None, ...]
    error: str | None = None
    alerts: tuple[str, ...] = ()  # what rewards.guard warned of: a few NaN/inf scores, no completion scored

    @property
    def finite(self) -> list[float]:
        return [v for v in self.scores if v is not None and math.isfinite(v)]

    @property
    def spread(self) -> float:
        values = self.finite
        return statistics.pstdev(values) if len(values) > 1 else 0.0

    @property
    def mean(self) -> float | None:
        values = self.finite
        return sum(values) / len(values) if values else None

    def warnings(self) -> list[str]:
        found = list(self.alerts)
        non_finite = sum(1 for v in self.scores if v is not None and not math.isfinite(v))
        if self.error:
            found.append(f"{self.name} raised {self.error}")
        elif non_finite:
            found.append(f"{self.name} scored {non_finite} completions NaN or inf: they are left out of training")
        elif not self.finite:
            found.append(f"{self.name} scored no completion (every score was None)")
        elif self.spread == 0.0 and len(self.scores) > 1:
            found.append(f"{self.name} gave every completion the same score ({self.mean:.4g}): a group with zero "
                         "spread teaches nothing; check its parameters against these completions")
        return found


@dataclass(frozen=True)
class RewardCheck:
    rewards: tuple[RewardResult, ...]
    samples: tuple[dict, ...] = ()
    errors: tuple[FieldError, ...] = field(default_factory=tuple)

    def warnings(self) -> list[str]:
        return [w for r in self.rewards for w in r.warnings()]

    @property
    def ok(self) -> bool:
        return not self.errors and not any(r.error for r in self.rewards)


_CHECKING: set[str] = set()  # who has a check running in this process (the dashboard serves everyone)
_CHECKING_LOCK = threading.Lock()


def check_rewards(cfg: TrainConfig, rows: int = 4, generations: int = 0, timeout_s: float = 300,
                  who: str = "") -> RewardCheck:
    """Run the check for ``cfg`` (a GRPO config). ``generations``: base-model answers per prompt (0: only the
    data's reference answers, which needs no model load). ``who`` (the person's name) runs one check at a time:
    a second one while the first runs is refused, so repeated clicks cannot pile up child processes; checks
    given no name share one turn."""
    with _CHECKING_LOCK:
        if who in _CHECKING:
            return RewardCheck((), errors=(FieldError("reward_check", "your previous reward check is still running: "
                                                                      "wait for its result, then check again"),))
        _CHECKING.add(who)
    try:
        return _check_in_child(cfg, rows, generations, timeout_s)
    finally:
        with _CHECKING_LOCK:
            _CHECKING.discard(who)


def _check_in_child(cfg: TrainConfig, rows: int, generations: int, timeout_s: float) -> RewardCheck:
    env = {**access.child_env(os.environ),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "TOKENIZERS_PARALLELISM": "false"}
    request = json.dumps({"config": cfg.to_public_dict(), "rows": rows, "generations": generations})
    try:
        command = sandbox.child_command([sys.executable, "-m", "trainer_core.worker.reward_check_child"],
                                        json.loads(request), env)
        done = subprocess.run(command, input=request, capture_output=True, text=True, env=env, timeout=timeout_s,
                              check=False)
    except sandbox.SandboxError as exc:
        return RewardCheck((), errors=(FieldError("reward_check", str(exc)),))
    except subprocess.TimeoutExpired:
        return RewardCheck((), errors=(FieldError("reward_check", f"took longer than {timeout_s:.0f} s: check "
                                                                  "with fewer rows or no generations"),))
    reply = files.last_json_line(done.stdout)
    if not isinstance(reply, dict):
        return RewardCheck((), errors=(FieldError("reward_check", f"the check process failed (exit "
                                                                  f"{done.returncode}): {done.stderr[-1500:]}"),))
    if "errors" in reply:
        return RewardCheck((), errors=tuple(FieldError(e["field"], e["message"]) for e in reply["errors"]))
    results = tuple(RewardResult(name=r["name"], kind=r["kind"], weight=r["weight"], scores=tuple(r["scores"]),
                                 error=r["error"], alerts=tuple(r.get("alerts", ()))) for r in reply["rewards"])
    return RewardCheck(results, samples=tuple(reply.get("samples", ())))


def report(result: RewardCheck) -> list[str]:
    """The check as lines of text (the CLI prints them; the form shows the same facts as a table)."""
    if result.errors:
        return [f"error: {e}" for e in result.errors]
    lines = [f"{len(result.samples)} completions scored"]
    for r in result.rewards:
        scores = ", ".join("None" if v is None else f"{v:.3g}" for v in r.scores)
        mean = "-" if r.mean is None else f"{r.mean:.4g}"
        lines.append(f"{r.name} ({r.kind}, weight {r.weight:g}): mean {mean}, spread {r.spread:.4g}"
                     + (f"; ERROR {r.error}" if r.error else f"; scores [{scores}]"))
    lines += [f"warning: {w}" for w in result.warnings()]
    return lines
