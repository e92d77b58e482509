"""What a sweep adds between its trials: the time from one trial's end to the next one's first step.

    .venv/bin/python bench/sweep_overhead.py [--fake] [--trials 4] [--steps 6] [--models DIR]

A grid sweep over the learning rate, one trial at a time (``parallel: 1``), driven the way the dashboard drives it
(a ``SweepRunner`` thread beside an ``Orchestrator`` pumping in this process; the bench never imports torch), in a
fresh data root. For each pair of consecutive trials it splits the gap into

* noticed:  the earlier run's end (``finished_at``) -> the next trial's run recorded (the driver's tick: it sees the
  run ended, tells Optuna, asks for the next values, starts the run through the orchestrator);
* launched: recorded -> its worker started (``started_at``: the queue and the launcher);
* first step: worker started -> its first step's progress event (``wall_time`` of step 1: the worker's own start,
  model load and data preparation -- what any run pays).

``--fake`` runs tests/fake_worker.py as the trials' worker (tests/support's FakeLauncher), so the first step is
the sweep's and orchestrator's cost alone; without it the trials train the bundled model for real.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", action="store_true", help="the fake worker (no training): the sweep's own cost")
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--models", default=str(ROOT / ".test-cache" / "models"), help="converted-model cache")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="sweep-bench-"))
    os.environ.update(FINETUNE_STUDIO_HOME=str(home), FINETUNE_STUDIO_MODELS=args.models,
                      FINETUNE_STUDIO_FORCE_CPU="1", FINETUNE_STUDIO_ALLOWED_ROOTS=str(home))
    if args.fake:
        os.environ.update(FAKE_LOSSES="lr", FAKE_STEPS=str(args.steps), FAKE_EVAL_EVERY="2", FAKE_DELAY="0.05")

    from db.store import Store
    from trainer_core.config import BUNDLED_MODEL
    from trainer_core.jobs.orchestrator import Orchestrator
    from trainer_core.sweeps import checks, record
    from trainer_core.sweeps.runner import SweepRunner

    launcher = None
    if args.fake:
        from tests.support import FakeLauncher

        launcher = FakeLauncher()
    orch = Orchestrator(Store(), launcher=launcher)
    runner = SweepRunner(orch)
    rates = [10 ** (-5 + i * 3 / max(1, args.trials - 1)) for i in range(args.trials)]
    config, errors = checks.read({
        "model_name": BUNDLED_MODEL, "max_steps": args.steps, "batch_size": 2, "max_seq_length": 128,
        "warmup_steps": 0, "eval_fraction": 0.05, "eval_steps": 2, "logging_steps": 1,
        "sweep": {"search": "grid", "params": {"learning_rate": [float(f"{r:.3g}") for r in rates]},
                  "pruner": "none"}})
    assert errors == [], errors
    started = time.time()
    sweep_id = runner.create(config)
    while record.read(sweep_id).status.is_active():
        time.sleep(0.5)
    total = time.time() - started
    runs = orch.store.sweep_runs(sweep_id)
    runner.close()
    orch.close()
    gaps = []
    for before, after in zip(runs, runs[1:]):
        first = orch.store.metrics_frame(after.id, columns=("wall_time",))
        first_step = float(first["wall_time"].dropna().iloc[0])
        gaps.append((after.created_at - before.finished_at, after.started_at - after.created_at,
                     first_step - after.started_at, first_step - before.finished_at))
    print(f"{'fake' if args.fake else 'bundled model'} trials: {len(runs)} in {total:.1f}s, load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for i, (noticed, launched, first, gap) in enumerate(gaps, start=1):
        print(f"  trial {i - 1} -> {i}: {gap:6.2f}s  (noticed {noticed:.2f}s, launched {launched:.2f}s, "
              f"first step {first:.2f}s)")
    if gaps:
        print("median: " + ", ".join(f"{name} {statistics.median(g[i] for g in gaps):.2f}s" for i, name in
                                     enumerate(("noticed", "launched", "first step", "end to next first step"))))
    if launcher is not None:
        launcher.kill_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
