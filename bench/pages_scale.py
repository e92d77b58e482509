"""Server render time of History, Run details and Compare at team scale, through Streamlit's AppTest.

Each case is a database of its own (a SQLite file, or a PostgreSQL schema when
FINETUNE_STUDIO_TEST_POSTGRES_URL is set and ``--backend postgresql``): History with 50, 500 and 2,000 runs
of 1,000 logged steps each (first page, and the last page at 2,000); Run details of a 1k- and a 100k-step
run, opened cold (the finished-run frame cache emptied first) and again warm; Compare of 6 runs x 1k and
6 x 20k steps. A render is one ``AppTest.run()`` of the page (the entry script, sidebar and the page:
what the server does for one browser request). Cases are measured interleaved for ``--rounds`` rounds and
the medians printed with their goal.

    .venv/bin/python bench/pages_scale.py [--rounds 5] [--backend sqlite|postgresql]
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import text
from streamlit.testing.v1 import AppTest

import ui.state
from db.entities import RunRecord
from db.store import Store
from trainer_core.protocol.metrics import METRIC_FIELDS
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol.status import RunStatus

APP = str(ROOT / "streamlit_app.py")
HISTORY_STEPS = 1_000


def fill(store: Store, runs: int, steps: int, prefix: str, seed: int = 0) -> list[str]:
    """``runs`` finished runs of ``steps`` logged steps each (loss, eval every 50 steps, lr, grad norm)."""
    rng = random.Random(seed)
    ids = []
    t0 = 1.7e9
    for i in range(runs):
        run_id = f"{prefix}-{i:05d}"
        created = t0 + i * 600
        store.create_run(RunRecord(id=run_id, name=f"{prefix} run {i}", status=RunStatus.RUNNING.value, model="tiny-llama",
                             dataset="demo_chat.jsonl", method="LoRA", created_at=created, started_at=created,
                             total_steps=steps, config_json='{"learning_rate": 0.0002}'))
        rows = []
        for step in range(1, steps + 1):
            row = {"step": step, "epoch": step / steps, "loss": 2.5 * (1 - 0.6 * step / steps) + rng.gauss(0, 0.05),
                   "learning_rate": 2e-4 * (1 - step / steps), "grad_norm": abs(rng.gauss(1, 0.2)),
                   "tokens_seen": 512 * step, "tokens_per_s": 3000.0, "elapsed_s": 0.5 * step,
                   "wall_time": created + 0.5 * step}
            if step % 50 == 0:
                row["eval_loss"] = row["loss"] + 0.05
            rows.append(row)
        write_metrics(store, run_id, rows)
        store.finish_run(run_id, RunStatus.COMPLETED, steps_done=steps, final_loss=rows[-1]["loss"],
                         finished_at=created + 0.5 * steps)
        ids.append(run_id)
    return ids


def write_metrics(store: Store, run_id: str, rows: list[dict]) -> None:
    """Test data in: the store's own upsert on SQLite, COPY on PostgreSQL (the same rows, 10x faster to fill)."""
    if store.is_sqlite:
        for start in range(0, len(rows), 20_000):
            store.append_metrics(run_id, rows[start:start + 20_000])
        return
    columns = ("step", *METRIC_FIELDS)
    raw = store.engine.raw_connection()
    try:
        with raw.cursor() as cursor:
            with cursor.copy(f"COPY metric (run_id, {', '.join(columns)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row((run_id, *[row.get(c, "" if c == "nonfinite" else None) for c in columns]))
        raw.commit()
    finally:
        raw.close()


def make_store(backend: str, name: str, home: Path) -> Store:
    if backend == "sqlite":
        return Store(f"sqlite:///{home / f'{name}.db'}")
    url = os.environ["FINETUNE_STUDIO_TEST_POSTGRES_URL"]
    schema = f"bench_{name}"
    admin = Store(url)
    with admin.engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    admin.engine.dispose()
    sep = "&" if "?" in url else "?"
    return Store(f"{url}{sep}options=-csearch_path%3D{schema}")


_COMPONENTS: list = []  # AppTest scans every installed package for components per instance: once is enough


def render(orch: Orchestrator, page: str, session: dict) -> float:
    """Seconds of one server render of ``page`` (a fresh AppTest: a new browser session)."""
    ui.state.get_orchestrator = lambda: orch  # the pages and the entry script ask ui.state for it
    at = AppTest.from_file(APP, default_timeout=300)
    if _COMPONENTS:
        at._bidi_component_manager = _COMPONENTS[0]  # test-harness cost (0.3-1.5 s here), not the server's
    for key, value in session.items():
        at.session_state[key] = value
    at.switch_page(page)
    started = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - started
    _COMPONENTS[:] = [at._bidi_component_manager]
    if at.exception:
        raise RuntimeError(f"{page}: {at.exception}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    args = parser.parse_args(argv)
    # AppTest's session state is written from this thread: Streamlit warns "missing ScriptRunContext" each time.
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").disabled = True
    home = Path(tempfile.mkdtemp(prefix="pages-bench-"))
    os.environ.update(FINETUNE_STUDIO_HOME=str(home / "home"), FINETUNE_STUDIO_FORCE_CPU="1")
    os.environ.pop("FINETUNE_STUDIO_PASSWORD", None)

    print(f"backend {args.backend}; data in {home}; filling the databases ...", flush=True)
    orchs: dict[str, Orchestrator] = {}
    t0 = time.perf_counter()
    for size in (50, 500, 2000):
        store = make_store(args.backend, f"history{size}", home)
        fill(store, size, HISTORY_STEPS, f"h{size}", seed=size)
        started = time.perf_counter()
        first_page = store.list_runs(limit=50)
        store.sparklines(first_page)  # what the first History visit after an upgrade does, once
        print(f"  history {size:>5} runs: sparklines of one page backfilled in "
              f"{1000 * (time.perf_counter() - started):.0f} ms (once)", flush=True)
        orchs[f"history{size}"] = Orchestrator(store=store, start_pump=False)
    detail = make_store(args.backend, "details", home)
    small = fill(detail, 1, 1_000, "d1k")[0]
    big = fill(detail, 1, 100_000, "d100k", seed=1)[0]
    orchs["details"] = Orchestrator(store=detail, start_pump=False)
    compare = make_store(args.backend, "compare", home)
    six_small = fill(compare, 6, 1_000, "c1k", seed=2)
    six_big = fill(compare, 6, 20_000, "c20k", seed=3)
    orchs["compare"] = Orchestrator(store=compare, start_pump=False)
    print(f"filled in {time.perf_counter() - t0:.0f} s", flush=True)

    def cold(orch: Orchestrator) -> None:
        orch.store._finished_frame.cache_clear()

    last_page = {"history_page": 40}
    cases = [  # (label, database, page, session state, cold?, goal in ms)
        ("History 50 runs", "history50", "pages/history.py", {}, False, 300),
        ("History 500 runs", "history500", "pages/history.py", {}, False, 300),
        ("History 2,000 runs", "history2000", "pages/history.py", {}, False, 300),
        ("History 2,000 runs, last page", "history2000", "pages/history.py", last_page, False, 300),
        ("Run details 1k steps, first open", "details", "pages/run.py", {"detail_run_id": small}, True, 500),
        ("Run details 1k steps, again", "details", "pages/run.py", {"detail_run_id": small}, False, 100),
        ("Run details 100k steps, first open", "details", "pages/run.py", {"detail_run_id": big}, True, 500),
        ("Run details 100k steps, again", "details", "pages/run.py", {"detail_run_id": big}, False, 100),
        ("Compare 6 x 1k steps", "compare", "pages/compare.py", {"compare_ids": six_small}, False, 500),
        ("Compare 6 x 20k steps, first open", "compare", "pages/compare.py", {"compare_ids": six_big}, True, 500),
        ("Compare 6 x 20k steps, again", "compare", "pages/compare.py", {"compare_ids": six_big}, False, 500),
    ]
    for label, db, page, session, is_cold, _ in cases:  # warm-up: imports, Streamlit's own caches
        render(orchs[db], page, session)
    times: dict[str, list[float]] = {c[0]: [] for c in cases}
    for _ in range(args.rounds):
        for label, db, page, session, is_cold, _ in cases:
            if is_cold:
                cold(orchs[db])
            times[label].append(render(orchs[db], page, session))
    print(f"\n{args.rounds} interleaved rounds, median server render per page ({args.backend})")
    print(f"{'case':<38} {'median ms':>10} {'min ms':>8} {'goal ms':>8}  met")
    medians = {}
    for label, *_, goal in cases:
        medians[label] = 1000 * statistics.median(times[label])
        print(f"{label:<38} {medians[label]:>10.0f} {1000 * min(times[label]):>8.0f} {goal:>8}  "
              f"{'yes' if medians[label] < goal else 'NO'}")
    print(f"ratio History 2,000 / 50 runs: {medians['History 2,000 runs'] / medians['History 50 runs']:.2f}x; "
          f"Run details 100k / 1k (first open): "
          f"{medians['Run details 100k steps, first open'] / medians['Run details 1k steps, first open']:.2f}x; "
          f"Compare 6 x 20k / 6 x 1k: {medians['Compare 6 x 20k steps, again'] / medians['Compare 6 x 1k steps']:.2f}x")
    for orch in orchs.values():
        orch.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
