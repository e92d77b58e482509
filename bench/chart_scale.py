"""How long one live-page refresh spends on charts, for runs of 1k, 10k and 100k logged steps.

Each refresh does what the server does for the live view: take the run's snapshot frame, build every
chart with ``charts.live_charts`` and serialise each one the way ``st.altair_chart`` does (Streamlit's
own converter: ``to_dict()`` with the Arrow data transformer; plain ``to_dict()`` if that private
function ever moves). Sizes are measured interleaved, several rounds, and the medians are printed.

Two cases: a run pumped by this process (its in-memory live state), and a run pumped by another process
(started from the CLI): the dashboard's orchestrator then follows it through the database. For that case
each run is stored in a SQLite database (PostgreSQL too when FINETUNE_STUDIO_TEST_POSTGRES_URL is set),
its pump lock is held as the other process would, and before every refresh one more step is stored;
the refresh is ``Orchestrator.snapshot()`` plus the charts.

    .venv/bin/python bench/chart_scale.py [--rounds 15]

Goals: 100k-step refresh well under 200 ms, and at most 2x the 1k-step one, in both cases.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlmodel import SQLModel

from db.entities import RunRecord
from db.store import Store
from trainer_core.views import charts
from trainer_core.jobs import adoption, orchestrator
from trainer_core.protocol import paths
from trainer_core.jobs.alerts import rows_from_frame
from trainer_core.jobs.live import LiveRun
from trainer_core.protocol.status import RunStatus

try:  # what st.altair_chart calls on the server
    from streamlit.elements.vega_charts import (
        _convert_altair_to_vega_lite_spec as serialise,
    )
except ImportError:  # pragma: no cover - a Streamlit without it: the plain Vega-Lite dict
    def serialise(chart):
        return chart.to_dict()

SIZES = (1_000, 10_000, 100_000)
EVAL_EVERY = 50


def synthetic_run(steps: int, seed: int = 0) -> LiveRun:
    """A run as the pump builds it: noisy decaying loss with spikes and NaNs, eval every 50 steps."""
    rng = np.random.default_rng(seed)
    step = np.arange(1, steps + 1)
    frac = step / steps
    loss = 0.6 + 2.2 * np.exp(-4 * frac) + rng.normal(0, 0.08, steps) * (1.2 - frac)
    grad = np.abs(rng.normal(1.0, 0.25, steps)) * (1.5 - frac)
    spikes = rng.choice(steps, size=5, replace=False)
    loss[spikes] *= 4
    grad[spikes] *= 25
    nan_at = set(rng.choice(steps, size=3, replace=False).tolist())
    warmup = max(1, steps // 20)
    lr = np.where(step < warmup, 2e-4 * step / warmup, 1e-4 * (1 + np.cos(np.pi * frac)))
    run = LiveRun("bench", "bench run", RunStatus.RUNNING)
    t0 = 1.7e9
    for i in range(steps):
        bad = i in nan_at
        run.add_metric({"step": i + 1, "epoch": 3 * frac[i], "loss": None if bad else float(loss[i]),
                        "learning_rate": float(lr[i]), "grad_norm": None if bad else float(grad[i]),
                        "tokens_seen": int(512 * (i + 1)), "tokens_per_s": float(rng.normal(3000, 150)),
                        "memory_mb": 1800.0, "elapsed_s": 0.5 * (i + 1), "wall_time": t0 + 0.5 * (i + 1),
                        "nonfinite": "grad_norm,loss" if bad else ""})
        if (i + 1) % EVAL_EVERY == 0:  # eval rows carry only step and eval loss, as EvalEvent does
            run.add_metric({"step": i + 1, "eval_loss": float(loss[i] + 0.05), "wall_time": t0 + 0.5 * (i + 1),
                            "nonfinite": ""})
    return run


def refresh(run: LiveRun) -> tuple[float, float, float, dict]:
    """One live refresh: snapshot wall seconds, charts+serialisation wall and CPU seconds, the specs."""
    t0 = time.perf_counter()
    frame = run.snapshot().metrics
    t1, c1 = time.perf_counter(), time.process_time()
    specs = {name: serialise(chart) for name, chart in charts.live_charts(frame).items()}
    return t1 - t0, time.perf_counter() - t1, time.process_time() - c1, specs


def points_sent(spec: dict) -> dict[str, int]:
    """Rows per series in a serialised chart (Arrow bytes or inline values)."""
    (data,) = spec["datasets"].values()
    if isinstance(data, (bytes, bytearray)):
        from streamlit import dataframe_util

        rows = dataframe_util.convert_arrow_bytes_to_pandas_df(data)
        return rows["series"].value_counts().to_dict()
    counts: dict[str, int] = {}
    for row in data:
        counts[row["series"]] = counts.get(row["series"], 0) + 1
    return counts


class RemoteRun:
    """A run another process pumps: stored in the database, its pump lock held, one new step per refresh."""

    def __init__(self, store: Store, steps: int):
        self.store = store
        self.run_id = f"remote-{steps}"
        me = psutil.Process()
        store.create_run(RunRecord(id=self.run_id, name=f"cli run {steps}", status=RunStatus.RUNNING.value,
                             created_at=time.time(), started_at=time.time(), total_steps=10 * steps, pid=me.pid,
                             pid_started_at=me.create_time()))
        rows = rows_from_frame(synthetic_run(steps).snapshot().metrics)
        for start in range(0, len(rows), 20_000):
            store.append_metrics(self.run_id, rows[start:start + 20_000])
        self.next_row = dict(rows[-1], eval_loss=None)
        run_dir = paths.run_dir(self.run_id)
        run_dir.mkdir(parents=True, exist_ok=True)  # the same ids on each backend
        self.lock = adoption.try_lock(run_dir)  # the other process's pump lock: nobody here adopts it

    def advance(self) -> None:
        self.next_row = dict(self.next_row, step=self.next_row["step"] + 1)
        self.store.append_metrics(self.run_id, [self.next_row], steps_done=self.next_row["step"])


def remote_refresh(orch: orchestrator.Orchestrator, run: RemoteRun) -> tuple[float, float]:
    """One Live refresh of a run pumped elsewhere: snapshot and charts, wall and CPU seconds."""
    run.advance()
    t0, c0 = time.perf_counter(), time.process_time()
    frame = orch.snapshot(run.run_id).metrics
    for chart in charts.live_charts(frame).values():
        serialise(chart)
    return time.perf_counter() - t0, time.process_time() - c0


def remote_case(label: str, store: Store, rounds: int) -> dict[int, list[float]]:
    runs = {n: RemoteRun(store, n) for n in SIZES}
    viewer = orchestrator.Orchestrator(store=store, start_pump=False)
    try:
        assert not any(viewer._is_tracked(r.run_id) for r in runs.values()), "the viewer must not pump them"
        for run in runs.values():  # the first view of a run reads all of its rows once
            started = time.perf_counter()
            viewer.snapshot(run.run_id)
            print(f"  [{label}] first view of {run.run_id}: {1000 * (time.perf_counter() - started):.0f} ms (once)")
        times: dict[int, list[tuple[float, float]]] = {n: [] for n in SIZES}
        for _ in range(rounds):
            for n, run in runs.items():
                times[n].append(remote_refresh(viewer, run))
    finally:
        viewer.close()
        for run in runs.values():
            run.lock.close()
    return {n: [1000 * statistics.median(t[i] for t in times[n]) for i in range(2)] for n in SIZES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    runs = {n: synthetic_run(n) for n in SIZES}
    for run in runs.values():  # warm-up: imports, template cache
        refresh(run)
    times: dict[int, list[tuple[float, float, float]]] = {n: [] for n in SIZES}
    for _ in range(args.rounds):
        for n, run in runs.items():
            times[n].append(refresh(run)[:3])
    median = {n: [1000 * statistics.median(t[i] for t in times[n]) for i in range(3)] for n in SIZES}
    print(f"serialiser: {serialise.__module__}.{serialise.__name__}; {args.rounds} interleaved rounds, medians")
    # CPU time is the steadier number on a shared machine; wall time is what a viewer waits.
    print(f"{'steps':>8} {'charts+serialise wall ms':>25} {'cpu ms':>8} {'snapshot wall ms':>17}")
    for n in SIZES:
        snap_ms, wall_ms, cpu_ms = median[n]
        print(f"{n:>8,} {wall_ms:>25.1f} {cpu_ms:>8.1f} {snap_ms:>17.1f}")
    small, big = median[SIZES[0]], median[SIZES[-1]]
    print(f"ratio 100k/1k: wall {big[1] / small[1]:.2f}x, cpu {big[2] / small[2]:.2f}x (goal <= 2x); "
          f"100k refresh: wall {big[1]:.1f} ms, cpu {big[2]:.1f} ms (goal well under 200 ms)")
    specs = refresh(runs[SIZES[-1]])[3]
    print("points sent per chart at 100k steps:")
    for name, spec in specs.items():
        counts = points_sent(spec)
        print(f"  {name:<14} {sum(counts.values()):>5} rows  " + ", ".join(f"{k}: {v}" for k, v in counts.items()))

    home = Path(tempfile.mkdtemp(prefix="chart-bench-"))
    os.environ["FINETUNE_STUDIO_HOME"] = str(home)
    stores = [("sqlite", Store(f"sqlite:///{home / 'remote.db'}"))]
    if os.environ.get("FINETUNE_STUDIO_TEST_POSTGRES_URL"):
        pg = Store(os.environ["FINETUNE_STUDIO_TEST_POSTGRES_URL"])
        SQLModel.metadata.drop_all(pg.engine)
        SQLModel.metadata.create_all(pg.engine)
        stores.append(("postgresql", pg))
    print("\nrun pumped by another process (snapshot from the database + charts), one new step per refresh")
    for label, store in stores:
        remote = remote_case(label, store, args.rounds)
        print(f"[{label}] {'steps':>8} {'refresh wall ms':>16} {'cpu ms':>8}")
        for n in SIZES:
            print(f"[{label}] {n:>8,} {remote[n][0]:>16.1f} {remote[n][1]:>8.1f}")
        small, big = remote[SIZES[0]], remote[SIZES[-1]]
        print(f"[{label}] ratio 100k/1k: wall {big[0] / small[0]:.2f}x, cpu {big[1] / small[1]:.2f}x (goal <= 2x); "
              f"100k refresh: wall {big[0]:.1f} ms (goal < 200 ms)")


if __name__ == "__main__":
    main()
