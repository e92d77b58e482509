"""Event-pipeline benchmark: worker -> events.jsonl -> orchestrator pump -> database.

A synthetic worker (tests/support/fake_worker.py, the real ``EventWriter``) emits N progress events as fast as it
can; the real orchestrator (the real launcher's environment through tests/support/fakes.py's
``FakeLauncher``, pump thread, MetricBuffer and Store) ingests them into a fresh
SQLite database under a temporary data root, and into PostgreSQL too when
FINETUNE_STUDIO_TEST_POSTGRES_URL is set.

How it measures: ``Store.append_metrics`` is wrapped; when a call returns, its transaction has committed,
so the wrapper records ``time.time()`` for every step in that batch. Each row carries the event's own
``ts`` (``wall_time``, stamped by the worker when it built the event; both processes read the same
clock). Delay per event = commit time - event ts. End-to-end rate = N / (last commit - first event ts).
Lost and duplicate counts come from the database afterwards (steps 1..N expected, once each), and every
stored loss is compared with the one in the log.

    .venv/bin/python bench/event_pipeline.py [--events 100000] [--linger] [--delay S] [--viewers K] [--profile N]

Goal (issue 14): >= 20,000 events/s end to end, p99 delay < 1 s, 0 lost, 0 duplicated.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlmodel import SQLModel

from db.store import Store
from trainer_core.protocol import events as ev
from tests.support import FakeLauncher
from trainer_core.jobs import orchestrator
from trainer_core.protocol import paths
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.protocol.status import RunStatus

GOAL_RATE, GOAL_P99_MS = 20_000, 1_000


def instrument(store: Store) -> dict[int, list[float]]:
    """step -> commit times of every append_metrics call that wrote it (more than one means a replay)."""
    committed: dict[int, list[float]] = {}
    real = store.append_metrics

    def append_metrics(run_id, rows, *args, **kwargs):
        rows = list(rows)
        real(run_id, rows, *args, **kwargs)
        now = time.time()  # the call returned: its transaction has committed
        for row in rows:
            committed.setdefault(int(row["step"]), []).append(now)

    store.append_metrics = append_metrics
    return committed


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the worker leads its own process group
    except ProcessLookupError:
        pass


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def profile_pump(top: int) -> None:
    """Run the pump thread under cProfile and print its ``top`` entries by own time when it ends."""
    real = orchestrator.Orchestrator._pump_forever

    def pump_forever(self) -> None:
        profile = cProfile.Profile()
        profile.runcall(real, self)
        print("\npump thread, by own time:")
        pstats.Stats(profile).sort_stats("tottime").print_stats(top)

    orchestrator.Orchestrator._pump_forever = pump_forever


def run_once(store: Store, events: int, label: str, viewers: int, linger: bool, delay: float = 0.0) -> dict:
    committed = instrument(store)
    os.environ.update(FAKE_STEPS=str(events), FAKE_DELAY=str(delay), FAKE_EVAL_EVERY="0", FAKE_HEARTBEAT_EVERY="0",
                      FAKE_START_DELAY="0", FAKE_LINGER=str(3600 if linger else 0))
    orch = orchestrator.Orchestrator(store=store, launcher=FakeLauncher())  # the synthetic worker, real launcher
    stop_viewers = threading.Event()

    def viewer(run_id: str) -> None:  # one browser on the Live page: a snapshot per second
        while not stop_viewers.wait(1.0):
            orch.snapshot(run_id)

    try:
        run_id = orch.start(TrainConfig(model_name=BUNDLED_MODEL, run_name=f"bench {label}", max_steps=events))
        for _ in range(viewers):
            threading.Thread(target=viewer, args=(run_id,), daemon=True).start()
        # Poll the database, not orch.wait(): wait() builds a full snapshot every tick, which would be
        # measuring the snapshot instead of the pipeline.
        pid = store.get_run(run_id).pid
        while not RunStatus(store.get_run(run_id).status).is_terminal():
            if linger and events in committed:  # every row is in: end the lingering worker's teardown
                time.sleep(0.5)  # the complete line follows the last step; let the pump read it
                _kill_group(pid)
            time.sleep(0.2)
    finally:
        stop_viewers.set()
        orch.close()
    run = store.get_run(run_id)

    logged: dict[int, ev.ProgressEvent] = {}
    for line in (paths.run_dir(run_id) / "events.jsonl").read_text().splitlines():
        event = ev.decode(line)
        if isinstance(event, ev.ProgressEvent):
            logged[event.step] = event
    frame = store.metrics_frame(run_id)
    steps = list(frame["step"])
    stored = dict(zip(frame["step"], frame["loss"]))
    first_emit = min(e.ts for e in logged.values())
    last_commit = max(max(times) for times in committed.values()) if committed else float("nan")
    delays = [committed[step][0] - e.ts for step, e in logged.items() if step in committed] or [float("nan")]
    return {
        "backend": label,
        "live viewers": viewers,
        "worker lingers": linger,
        "final status": run.status + (f" ({run.error})" if run.error else ""),
        "events emitted": len(logged),
        "events/s end to end": len(committed) / (last_commit - first_emit),
        "emit span s": max(e.ts for e in logged.values()) - first_emit,
        "total s": last_commit - first_emit,
        "delay p50 ms": 1000 * statistics.median(delays),
        "delay p99 ms": 1000 * percentile(delays, 99),
        "delay max ms": 1000 * max(delays),
        "batches": len({t for times in committed.values() for t in times}),
        "lost": len(set(range(1, events + 1)) - set(steps)),
        "duplicate rows": len(steps) - len(set(steps)),
        "steps written twice (replays)": sum(1 for times in committed.values() if len(times) > 1),
        "loss mismatches": sum(1 for step, e in logged.items() if stored.get(step) != e.loss),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="progress events to emit (default 100000)")
    parser.add_argument("--delay", type=float, default=0.0,
                        help="seconds the worker sleeps between events (default 0: as fast as it can)")
    parser.add_argument("--linger", action="store_true",
                        help="keep the worker alive after its last event until every row is stored (works around "
                             "the pump deciding on an exited worker after reading only one more 4 MiB chunk)")
    parser.add_argument("--viewers", type=int, default=0,
                        help="threads taking a live snapshot once a second, like open Live pages (default 0)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile the pump thread and print its N most expensive functions (slows it down)")
    args = parser.parse_args(argv)
    if args.profile:
        profile_pump(args.profile)
    home = Path(tempfile.mkdtemp(prefix="event-bench-"))
    os.environ.update(FINETUNE_STUDIO_HOME=str(home / "home"), FINETUNE_STUDIO_FORCE_CPU="1",
                      FINETUNE_STUDIO_ALLOWED_ROOTS=str(home))
    os.environ.pop("DATABASE_URL", None)
    stores = [("sqlite", Store(f"sqlite:///{home / 'bench.db'}"))]
    postgres = os.environ.get("FINETUNE_STUDIO_TEST_POSTGRES_URL")
    if postgres:
        pg = Store(postgres)
        SQLModel.metadata.drop_all(pg.engine)  # a clean schema, as the test fixture does
        SQLModel.metadata.create_all(pg.engine)
        stores.append(("postgresql", pg))
    print(f"{args.events} progress events; data root {home}")
    failed = False
    for label, store in stores:
        result = run_once(store, args.events, label, args.viewers, args.linger, args.delay)
        print(f"\n[{label}]")
        for key, value in result.items():
            print(f"  {key:<32} {value:,.1f}" if isinstance(value, float) else f"  {key:<32} {value}")
        failed |= bool(result["lost"] or result["duplicate rows"] or result["loss mismatches"]
                       or not result["final status"].startswith(RunStatus.COMPLETED.value))
        met = {"rate": result["events/s end to end"] >= GOAL_RATE, "p99": result["delay p99 ms"] < GOAL_P99_MS,
               "nothing lost": not (result["lost"] or result["duplicate rows"] or result["loss mismatches"])}
        print(f"  goal >= {GOAL_RATE:,} events/s, p99 < {GOAL_P99_MS:,} ms, 0 lost: "
              + ", ".join(f"{name} {'met' if ok else 'NOT met'}" for name, ok in met.items())
              + f" (the worker alone emitted {args.events / result['emit span s']:,.0f} events/s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
