"""A synthetic training worker for fault tests and the event-pipeline benchmark.

Run as ``python tests/fake_worker.py RUN_DIR`` (the orchestrator's real ``_spawn`` starts it in place of
``-m trainer_core.worker``). It writes events through the real ``EventWriter`` and honours control.json
and SIGTERM like the real worker, but trains nothing, so a run takes a fraction of a second.

Behaviour comes from the environment (``_spawn`` passes it on):

* ``FAKE_STEPS`` (30), ``FAKE_DELAY`` seconds between steps (0.02), ``FAKE_EVAL_EVERY`` (5, 0: never),
  ``FAKE_HEARTBEAT_EVERY`` steps (7, 0: never)
* ``FAKE_START_DELAY`` seconds before the first event (0), ``FAKE_LINGER`` seconds after the last (0)
* ``FAKE_SEED``: losses are drawn from ``random.Random(seed + run folder name)``, so each run differs

Losses are random floats on purpose: a test comparing the event log with the database then catches a
value written to the wrong step.
"""
from __future__ import annotations

import os
import random
import signal
import sys
import time
from pathlib import Path

from trainer_core import control
from trainer_core import events as ev


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def main(run_dir: Path) -> int:
    steps = int(env_float("FAKE_STEPS", 30))
    delay = env_float("FAKE_DELAY", 0.02)
    eval_every = int(env_float("FAKE_EVAL_EVERY", 5))
    heartbeat_every = int(env_float("FAKE_HEARTBEAT_EVERY", 7))
    rng = random.Random(f"{os.environ.get('FAKE_SEED', '0')}:{run_dir.name}")
    terminated = []
    signal.signal(signal.SIGTERM, lambda *_: terminated.append(True))  # like the real worker: SIGTERM = cancel

    time.sleep(env_float("FAKE_START_DELAY", 0))
    out = ev.EventWriter(run_dir / "events.jsonl")
    out.emit(ev.StatusEvent(status="starting", phase="loading model", engine="fake"))
    out.emit(ev.StatusEvent(status="running", phase="training", engine="fake"))
    done, status, last_loss = 0, "completed", None
    for step in range(1, steps + 1):
        action = control.Action.CANCEL if terminated else control.read(run_dir)
        if action is not None:
            status = "stopped" if action is control.Action.STOP else "cancelled"
            if action is control.Action.STOP:
                out.emit(ev.CheckpointEvent(step=done, path=str(run_dir / "checkpoints" / f"checkpoint-{done}")))
            break
        last_loss = rng.uniform(0.1, 4.0)
        out.emit(ev.ProgressEvent(step=step, total_steps=steps, epoch=step / steps, loss=last_loss,
                                  learning_rate=rng.uniform(1e-5, 1e-3), grad_norm=rng.uniform(0.1, 2.0),
                                  tokens_seen=64 * step, elapsed_s=step * delay))
        if eval_every and step % eval_every == 0:
            out.emit(ev.EvalEvent(step=step, eval_loss=rng.uniform(0.1, 4.0)))
        if heartbeat_every and step % heartbeat_every == 0:
            out.emit(ev.HeartbeatEvent(pid=os.getpid()))
        done = step
        if delay:
            time.sleep(delay)  # sleep(0) still yields the CPU: on a busy machine that alone cost ~150 us a step
    out.emit(ev.CompleteEvent(status=status, output_dir=str(run_dir / "adapter"), steps=done, final_loss=last_loss))
    out.close()
    time.sleep(env_float("FAKE_LINGER", 0))  # the real worker takes a while to tear down after its last event
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
