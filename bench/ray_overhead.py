"""What the Ray launcher costs over local torchrun, on the same two-process training job (gloo on CPU).

    .venv/bin/python bench/ray_overhead.py [--steps 30] [--pairs 2] [--model DIR]

(a) ``launcher: local``: torchrun on this host, two ranks (trainer_core/worker/launch.py).
(b) ``launcher: ray``: a Ray job on a local cluster of two nodes (tests/support/ray_cluster.py, started and stopped
    here), Ray Train's TorchTrainer with two workers, one per node, each running the same rank recipe.

Both go through the orchestrator, as the dashboard starts them, and alternate (a b, b a, ...) so load from
other processes hits both sides alike. Steps/s is measured over the training loop only (bench/overhead.py's
definition: steps between the first and last logged step over the wall time between their progress events);
time to first step runs from ``Orchestrator.start`` to the first step's progress event and holds the start-up
overhead (Ray: job submission, Ray Train's controller and worker group, the process group). The cluster's own
start is timed apart. The bench process plays the dashboard: it never imports torch.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: make trainer_core, db and tests importable

from bench.overhead import steps_per_s  # noqa: E402 - the one definition of steps/s
from tests.support.ray_cluster import local_cluster  # noqa: E402
from tests.support import MODELS_CACHE, build_tiny_model  # noqa: E402
from trainer_core.config import TrainConfig  # noqa: E402
from trainer_core.jobs.orchestrator import Orchestrator  # noqa: E402
from trainer_core.protocol.status import RunStatus  # noqa: E402

RUN_TIMEOUT_S = 1800


@dataclass
class Result:
    side: str  # "local" or "ray"
    first_step_s: float  # Orchestrator.start -> the first step's progress event
    steps_per_s: float
    total_s: float  # start -> completed, loading and saving included


def run(orch: Orchestrator, cfg: TrainConfig, side: str) -> Result:
    started = time.time()
    run_id = orch.start(cfg)
    snap = orch.wait(run_id, timeout=RUN_TIMEOUT_S)
    done = time.time()
    if snap.status is not RunStatus.COMPLETED:
        raise RuntimeError(f"{side} run {run_id} ended {snap.status.value}: {snap.error}\n{orch.log_tail(run_id)}")
    frame = orch.metrics(run_id)
    train = frame[frame["loss"].notna()].sort_values("step")
    steps, times = [int(s) for s in train["step"]], [float(t) for t in train["wall_time"]]
    return Result(side, times[0] - started, steps_per_s(steps, times), done - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--model", default="", help="model folder (default: the tests' tiny 2-layer Llama)")
    args = parser.parse_args(argv)
    model = args.model or str(build_tiny_model())
    work = Path(tempfile.mkdtemp(prefix="ray-bench-"))
    os.environ.update(FINETUNE_STUDIO_HOME=str(work / "home"), FINETUNE_STUDIO_SHARED_STORAGE=str(work),
                      FINETUNE_STUDIO_MODELS=str(MODELS_CACHE), FINETUNE_STUDIO_FORCE_CPU="1",
                      FINETUNE_STUDIO_ALLOWED_ROOTS=f"{work}:{Path(model).resolve().parent}",
                      OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    base = dict(model_name=model, num_processes=2, max_steps=args.steps, batch_size=2, max_seq_length=128,
                logging_steps=1, warmup_steps=0, save_steps=0)
    configs = {"local": TrainConfig(**base, launcher="local"), "ray": TrainConfig(**base, launcher="ray")}
    print(f"bench: {args.pairs} pairs of {args.steps} steps, two processes (gloo, CPU), {model}", flush=True)
    started = time.time()
    with local_cluster() as cluster:
        print(f"local two-node Ray cluster up in {time.time() - started:.1f}s", flush=True)
        os.environ["RAY_ADDRESS"] = cluster.address
        orch = Orchestrator()
        results: list[Result] = []
        try:
            for i in range(args.pairs):
                order = ("local", "ray") if i % 2 == 0 else ("ray", "local")
                pair = [run(orch, configs[side], side) for side in order]
                results += pair
                print("  ".join(f"{r.side}: first step {r.first_step_s:.1f}s, {r.steps_per_s:.3f} steps/s, "
                                f"total {r.total_s:.1f}s" for r in pair), flush=True)
        finally:
            orch.close()
    report(results)
    return 0


def report(results: list[Result]) -> None:
    def median(side: str, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in results if r.side == side)

    print(f"\n{'':24}{'local torchrun':>16}{'Ray':>12}")
    for label, attr in (("time to first step (s)", "first_step_s"), ("steps/s", "steps_per_s"),
                        ("start to completed (s)", "total_s")):
        print(f"{label:24}{median('local', attr):16.3f}{median('ray', attr):12.3f}")
    ratio = median("ray", "steps_per_s") / median("local", "steps_per_s")
    overhead = median("ray", "first_step_s") - median("local", "first_step_s")
    print(f"\nsteps/s ratio Ray / local: {ratio:.3f} (goal >= 0.95); start-up overhead of Ray: {overhead:+.1f}s "
          "(job submission, Ray Train's controller and worker group, the rendezvous)")


if __name__ == "__main__":
    sys.exit(main())
