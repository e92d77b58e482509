"""The fake worker of the tests and the event-pipeline benchmark: a training worker that trains nothing.

Run as ``python tests/support/fake_worker.py RUN_DIR`` (tests/support/fakes.py's ``FakeLauncher`` starts it in place
of ``-m trainer_core.worker``, with the real launcher's environment). It writes events through the real
``EventWriter`` and honours control.json and SIGTERM like the real worker, so a run takes a fraction of a
second. Behaviour comes from the environment (the launcher passes it on; ``tests.support.fake()`` sets it):

* ``FAKE_MODE``: ``train`` (default); ``ignore`` ignores control.json and SIGTERM and hangs after its steps
  (for the watchdog); ``exit3`` prints and exits with code 3; ``raise`` dies with a traceback. Neither of
  the last two writes a terminal event.
* ``FAKE_STEPS`` (30), ``FAKE_DELAY`` seconds between steps (0.02), ``FAKE_START_DELAY`` seconds before the
  first event (0), ``FAKE_LINGER`` seconds after the last (0: the real worker tears down for a while)
* ``FAKE_LOSSES``: ``random`` (default) draws losses from ``random.Random(FAKE_SEED + run folder name)``, so a
  test comparing the event log with the database catches a value written to the wrong step; ``scripted``
  gives 2/step with NaN at ``FAKE_NAN_STEP`` (3), evals at ``FAKE_EVALS`` ("4:0.75") and checkpoints at
  ``FAKE_CHECKPOINTS`` ("4"), so a test can assert exact values.
* random losses only: ``FAKE_EVAL_EVERY`` (5, 0: never) and ``FAKE_HEARTBEAT_EVERY`` steps (7, 0: never)
* ``FAKE_PAUSE_AT`` step and ``FAKE_PAUSE_UNTIL`` file: after that step, wait until the file exists (a test
  acts mid-run without racing the worker); ``{run}`` in its name is the run's id (one marker per run)
* ``FAKE_LOSSES=lr`` (sweeps): losses that depend on the run's learning_rate (config.yaml), best at 1e-3: eval
  loss ``(1 + |log10(lr) + 3|) * (1 + 1/step)`` every ``FAKE_EVAL_EVERY`` steps; a learning rate of 0.5 or more
  diverges (the train loss doubles each step). A resumed run continues from its checkpoint's step; a Stop writes
  a completed checkpoint folder, so the run can be resumed
* ``FAKE_SAMPLE_EVERY`` steps (0: never): sample events for two prompts (``SAMPLE_PROMPTS``); the first answer
  is always healthy, the second cycles through ``SAMPLE_ANSWERS`` (healthy, empty, a loop, a template leak),
  flagged by the real ``samples_check`` as the worker flags them
"""
from __future__ import annotations

import math
import os
import random
import signal
import sys
import time
from pathlib import Path

import yaml

from trainer_core.evaluation import samples_check
from trainer_core.protocol import control
from trainer_core.protocol import events as ev

SAMPLE_PROMPTS = ("What is the capital of France?", "Say **hi** <b>now</b>")
SAMPLE_ANSWERS = ("Hi!", "", "hi hi hi hi hi hi hi hi", "Hi<|im_end|>")


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def steps_of(name: str, default: str) -> list[str]:
    return [p for p in os.environ.get(name, default).split(",") if p]


def main(run_dir: Path) -> int:
    mode = os.environ.get("FAKE_MODE", "train")
    steps = int(env_float("FAKE_STEPS", 30))
    delay = env_float("FAKE_DELAY", 0.02)
    pause_at = int(env_float("FAKE_PAUSE_AT", 0))
    pause_until = os.environ.get("FAKE_PAUSE_UNTIL", "").replace("{run}", run_dir.name)
    print("fake worker started; HF_TOKEN set:", bool(os.environ.get("HF_TOKEN")), flush=True)
    if mode == "exit3":
        print("fake worker: cannot go on, exiting with code 3", flush=True)
        return 3
    if mode == "raise":
        raise RuntimeError("fake worker exploded")
    terminated = []
    if mode == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: terminated.append(True))  # like the real worker: SIGTERM = cancel

    scripted = os.environ.get("FAKE_LOSSES", "random") == "scripted"
    by_lr = os.environ.get("FAKE_LOSSES") == "lr"
    first = 1
    if by_lr:
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        lr = float(cfg["learning_rate"])
        resumed = cfg.get("resume_from_checkpoint") or ""
        first = int(resumed.rsplit("-", 1)[1]) + 1 if resumed else 1
        every = int(env_float("FAKE_EVAL_EVERY", 5))
        level = 1 + abs(math.log10(lr) + 3)
        evals = {s: level * (1 + 1 / s) for s in range(every, steps + 1, every)} if every else {}
        checkpoints, heartbeat_every = set(), 0

        def loss(step: int) -> float:
            return 2.0 ** step if lr >= 0.5 else level * (1 + 1 / step)
    elif scripted:
        nan_step = int(env_float("FAKE_NAN_STEP", 3))
        evals = {int(s): float(v) for s, v in (p.split(":") for p in steps_of("FAKE_EVALS", "4:0.75"))}
        checkpoints = {int(s) for s in steps_of("FAKE_CHECKPOINTS", "4")}
        heartbeat_every = 0

        def loss(step: int) -> float:
            return math.nan if step == nan_step else 2.0 / step
    else:
        rng = random.Random(f"{os.environ.get('FAKE_SEED', '0')}:{run_dir.name}")
        every = int(env_float("FAKE_EVAL_EVERY", 5))
        evals, checkpoints = {}, set()  # evals are drawn as the steps go
        heartbeat_every = int(env_float("FAKE_HEARTBEAT_EVERY", 7))

        def loss(step: int) -> float:
            return rng.uniform(0.1, 4.0)

    sample_every = int(env_float("FAKE_SAMPLE_EVERY", 0))
    time.sleep(env_float("FAKE_START_DELAY", 0))
    out = ev.EventWriter(run_dir / "events.jsonl")
    if not scripted:  # scripted runs keep the shortest timeline: tests assert it exactly
        out.emit(ev.StatusEvent(status="starting", phase="loading model", engine="fake"))
    out.emit(ev.StatusEvent(status="running", phase="training", engine="fake"))
    done, status, last_loss = first - 1, "completed", None
    for step in range(first, steps + 1):
        action = None if mode == "ignore" else (control.Action.CANCEL if terminated else control.read(run_dir))
        if action is not None:
            status = "stopped" if action is control.Action.STOP else "cancelled"
            if action is control.Action.STOP:
                out.emit(ev.StatusEvent(status="stopping", phase="saving", engine="fake"))
                out.emit(ev.CheckpointEvent(step=done, path=str(run_dir / "checkpoints" / f"checkpoint-{done}")))
                if by_lr:  # a completed checkpoint (trainer_state.json last), so Resume finds it
                    folder = run_dir / "checkpoints" / f"checkpoint-{done}"
                    folder.mkdir(parents=True, exist_ok=True)
                    (folder / "trainer_state.json").write_text("{}")
            break
        last_loss = loss(step)
        if scripted or by_lr:
            out.emit(ev.ProgressEvent(step=step, total_steps=steps, epoch=step / steps, loss=last_loss,
                                      learning_rate=1e-4, tokens_seen=100 * step))
        else:
            out.emit(ev.ProgressEvent(step=step, total_steps=steps, epoch=step / steps, loss=last_loss,
                                      learning_rate=rng.uniform(1e-5, 1e-3), grad_norm=rng.uniform(0.1, 2.0),
                                      tokens_seen=64 * step, elapsed_s=step * delay))
            if every and step % every == 0:
                evals[step] = rng.uniform(0.1, 4.0)
        if step in evals:
            out.emit(ev.EvalEvent(step=step, eval_loss=evals[step]))
        if step in checkpoints:
            out.emit(ev.CheckpointEvent(step=step, path=str(run_dir / "checkpoints" / f"checkpoint-{step}")))
        if sample_every and step % sample_every == 0:
            emit_samples(out, step, step // sample_every - 1)
        if heartbeat_every and step % heartbeat_every == 0:
            out.emit(ev.HeartbeatEvent(pid=os.getpid()))
        done = step
        if delay:
            time.sleep(delay)  # sleep(0) still yields the CPU: on a busy machine that alone cost ~150 us a step
        if step == pause_at:  # a test holds the run here until it has done what must happen mid-run
            while not Path(pause_until).exists():
                time.sleep(0.01)
    if mode == "ignore":
        time.sleep(60)  # hang (safety net: a broken watchdog fails the test by timeout, not forever)
        return 0
    final = loss(done) if scripted and done else last_loss
    out.emit(ev.CompleteEvent(status=status, output_dir=str(run_dir / "adapter"), steps=done, final_loss=final))
    out.close()
    print("fake worker:", status, "at step", done, flush=True)
    time.sleep(env_float("FAKE_LINGER", 0))  # the real worker takes a while to tear down after its last event
    return 0


def emit_samples(out: ev.EventWriter, step: int, round_: int) -> None:
    answers = ("The capital of France is Paris.", SAMPLE_ANSWERS[round_ % len(SAMPLE_ANSWERS)])
    for index, (prompt, text) in enumerate(zip(SAMPLE_PROMPTS, answers)):
        out.emit(ev.SampleEvent(step=step, index=index, prompt=prompt, text=text, new_tokens=len(text.split()),
                                flags=samples_check.check(text)))


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
