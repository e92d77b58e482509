"""Team scale: every run reachable (History pages and search, links resolved by id), sparklines stored with
the run and backfilled once, the batched upsert, and the incremental view of a run pumped elsewhere."""
from __future__ import annotations

import json
import os
import random
import time

import psutil
import pytest
from sqlalchemy import case, func, inspect, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, delete

from db.entities import RunRecord
from db.models import Metric
from db.store import Store
from tests.support.factories import insert_finished_run
from tests.support.apptest import open_page
from trainer_core.protocol import events as ev
from trainer_core.jobs import adoption
from trainer_core.protocol import paths
from trainer_core.jobs.alerts import rows_from_frame
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol.metrics import METRIC_FIELDS, merge_metric, merge_rows, thin
from trainer_core.protocol.status import RunStatus


def add_runs(store: Store, count: int, start: float = 1.7e9) -> list[str]:
    """``count`` finished runs, the first one the oldest; ids run-0000, run-0001, ..."""
    ids = []
    for i in range(count):
        run_id = f"run-{i:04d}"
        store.create_run(RunRecord(id=run_id, name=f"run number {i}", status=RunStatus.COMPLETED.value, model="tiny",
                             dataset="demo.jsonl", method="LoRA", created_at=start + i, finished_at=start + i + 1))
        ids.append(run_id)
    return ids


# ====================================================================== every run reachable
def test_list_runs_pages_searches_and_leaves_heavy_columns_out(store):
    ids = add_runs(store, 120)
    newest_first = ids[::-1]
    assert [r.id for r in store.list_runs(limit=50)] == newest_first[:50]
    assert [r.id for r in store.list_runs(limit=50, offset=100)] == newest_first[100:]
    assert store.count_runs() == 120
    assert [r.id for r in store.list_runs(search="NUMBER 7")] == ["run-0079", "run-0078", "run-0077", "run-0076",
                                                                  "run-0075", "run-0074", "run-0073", "run-0072",
                                                                  "run-0071", "run-0070", "run-0007"]
    assert store.count_runs("number 7") == 11
    assert store.count_runs("number_") == 0  # LIKE wildcards in a search are plain characters
    assert [r.id for r in store.get_runs(["run-0003", "missing", "run-0001"])] == ["run-0003", "run-0001"]
    listed = store.list_runs(limit=1)[0]
    assert (listed.config_json, listed.log_tail) == (None, None)  # not read for lists: get_run reads them
    assert store.get_run(listed.id).config_json == "{}"
    assert [r.id for r in store.find_runs("run-000")] == [f"run-000{i}" for i in range(9, -1, -1)]


def test_history_pages_through_every_run_and_finds_old_ones(app_home):
    add_runs(Store(), 120)
    at = open_page("pages/history.py")
    assert at.dataframe[0].value["id"].tolist() == [f"run-{i:04d}" for i in range(119, 69, -1)]
    at.number_input(key="history_page").set_value(3).run()
    assert not at.exception, at.exception
    assert at.dataframe[0].value["id"].tolist() == [f"run-{i:04d}" for i in range(19, -1, -1)]
    assert any("Runs 101 to 120 of 120" in c.value for c in at.caption)
    at.text_input(key="history_search").set_value("run number 5").run()  # the page resets to one that exists
    assert not at.exception, at.exception
    assert at.dataframe[0].value["id"].tolist() == ["run-0059", "run-0058", "run-0057", "run-0056", "run-0055",
                                                     "run-0054", "run-0053", "run-0052", "run-0051", "run-0050",
                                                     "run-0005"]


def test_links_to_old_runs_open_them_on_run_details_and_compare(app_home):
    add_runs(Store(), 120)
    insert_finished_run(Store(), "old-a", "oldest run", [2.0, 1.5], created_at=1.0)
    insert_finished_run(Store(), "old-b", "second oldest", [3.0, 2.5], created_at=2.0)
    at = open_page("pages/run.py", detail_run_id="old-a")
    assert at.selectbox(key="run_pick").value == "old-a"
    assert any(m.value == "### oldest run" for m in at.markdown)
    at = open_page("pages/compare.py", compare_ids=["old-a", "old-b"])
    assert at.multiselect(key="compare_pick").value == ["old-a", "old-b"]
    assert not any("picked" in i.value for i in at.info)


def test_a_link_to_a_deleted_run_says_so(app_home):
    add_runs(Store(), 3)
    at = open_page("pages/run.py", detail_run_id="gone")
    assert any("does not exist" in w.value for w in at.warning)
    assert at.selectbox(key="run_pick").value == "run-0002"


# ====================================================================== sparklines
def test_sparklines_are_backfilled_once_and_then_read_from_the_run(store):
    insert = [("a", [float(i) for i in range(200)]), ("b", [5.0, None, 4.0]), ("c", [])]
    for run_id, losses in insert:
        store.create_run(RunRecord(id=run_id, status=RunStatus.RUNNING.value, created_at=time.time()))
        store.append_metrics(run_id, [{"step": i + 1, "loss": loss} for i, loss in enumerate(losses)])
    runs = store.list_runs()
    assert all(r.sparkline is None for r in runs)  # recorded without one (as before the column existed)
    expected = {"a": thin([float(i) for i in range(200)], 60), "b": [5.0, 4.0], "c": []}
    assert store.sparklines(runs) == expected
    assert {r.id: json.loads(r.sparkline) for r in store.list_runs()} == expected
    with Session(store.engine) as session:  # from now on the metrics are not read again
        session.exec(delete(Metric))
        session.commit()
    assert store.sparklines(store.list_runs()) == expected
    assert len(expected["a"]) == 60 and expected["a"][0] == 0.0 and expected["a"][-1] == 199.0


def test_an_old_database_gets_the_column_and_the_indexes(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    store = Store(url)
    store.create_run(RunRecord(id="old", created_at=1.0))
    with store.engine.begin() as conn:
        conn.execute(text("DROP INDEX ix_run_created_at"))
        conn.execute(text("DROP INDEX ix_run_parent_run_id"))
        conn.execute(text("ALTER TABLE run DROP COLUMN sparkline"))
    store.engine.dispose()
    upgraded = Store(url)
    indexes = {i["name"] for i in inspect(upgraded.engine).get_indexes("run")}
    assert {"ix_run_created_at", "ix_run_parent_run_id"} <= indexes
    assert upgraded.get_run("old").sparkline is None
    assert upgraded.sparklines(upgraded.list_runs()) == {"old": []}


def test_the_pump_keeps_the_sparkline_of_a_running_run_current(home, store, fake_launcher, monkeypatch):
    monkeypatch.setenv("FAKE_STEPS", "300")
    monkeypatch.setenv("FAKE_DELAY", "0")
    orch = Orchestrator(store=store, launcher=fake_launcher)
    try:
        run_id = orch.start(TrainConfig(model_name=BUNDLED_MODEL, run_name="sparkline", max_steps=300))
        orch.wait(run_id, timeout=60, interval=0.05)
    finally:
        orch.close()
    losses = [e.loss for e in ev.read_new(paths.run_dir(run_id) / "events.jsonl", 0)[0]
              if isinstance(e, ev.ProgressEvent)]
    run = store.get_run(run_id)
    assert len(losses) == 300
    assert json.loads(run.sparkline) == thin(losses, 60)
    assert store.sparklines([run]) == {run_id: thin(losses, 60)}


# ====================================================================== the batched upsert
def multi_values_upsert(store: Store, run_id: str, rows: list[dict]):
    """The statement append_metrics built per 500-row chunk before it compiled one upsert for executemany."""
    dialect = sqlite if store.is_sqlite else postgresql
    keys = ["run_id", "step", *METRIC_FIELDS]
    normalised = [{k: ({**r, "run_id": run_id}).get(k) for k in keys} for r in rows]
    for r in normalised:
        r["nonfinite"] = r["nonfinite"] or ""
    stmt = dialect.insert(Metric).values(normalised)
    table = Metric.__table__
    updates = {name: func.coalesce(stmt.excluded[name], table.c[name]) for name in METRIC_FIELDS}
    new, old = stmt.excluded["nonfinite"], table.c["nonfinite"]
    updates["nonfinite"] = case((new == "", old), (old == "", new),
                                (("," + old + ",").like("%," + new + ",%"), old), else_=old + "," + new)
    return stmt.on_conflict_do_update(index_elements=["run_id", "step"], set_=updates)


def test_batched_upsert_stores_exactly_the_merge_of_every_row(store):
    """Random batches with repeated steps, eval rows for steps already stored, missing and non-finite fields:
    the table ends up as the row-by-row merge of everything written (what the multi-VALUES upsert stored)."""
    rng = random.Random(14)
    store.create_run(RunRecord(id="r", status=RunStatus.RUNNING.value))
    store.create_run(RunRecord(id="before", status=RunStatus.RUNNING.value))
    expected: dict[int, dict] = {}
    for batch in range(30):
        rows = []
        for _ in range(rng.randint(0, 80)):
            step = rng.randint(1, 400)
            row = {"step": step}
            for name in ("epoch", "loss", "eval_loss", "learning_rate", "grad_norm", "tokens_per_s", "memory_mb",
                         "elapsed_s", "wall_time"):
                if rng.random() < 0.4:
                    row[name] = rng.uniform(0, 5)
            if rng.random() < 0.3:
                row["tokens_seen"] = rng.randint(0, 10**6)
            row["nonfinite"] = rng.choice(["", "", "", "loss", "grad_norm", "eval_loss", "grad_norm,loss"])
            rows.append(row)
            merge_metric(expected.setdefault(step, {"step": step}), row)
        store.append_metrics("r", rows, event_offset=batch)
        with Session(store.engine) as session:  # the same batch through the upsert the store used before
            for chunk in range(0, len(rows), 500):
                merged = merge_rows(rows[chunk:chunk + 500])
                if merged:
                    session.exec(multi_values_upsert(store, "before", merged))
            session.commit()
    frame = store.metrics_frame("r")
    assert rows_from_frame(frame) == rows_from_frame(store.metrics_frame("before"))
    assert frame["step"].tolist() == sorted(expected)
    stored = {row["step"]: row for row in rows_from_frame(frame)}
    for step, row in expected.items():
        got = stored[step]
        for name, value in row.items():
            if name == "nonfinite":
                assert set(got["nonfinite"].split(",")) - {""} == set(value.split(",")) - {""}, step
            else:
                assert got[name] == value, (step, name)
        assert all(got[name] is None for name in got if name not in row and name != "nonfinite"), step
    assert store.get_run("r").event_offset == 29


def test_finished_frames_are_cached_and_running_ones_are_not(store):
    store.create_run(RunRecord(id="r", status=RunStatus.RUNNING.value))
    store.append_metrics("r", [{"step": 1, "loss": 1.0}])
    assert store.metrics_frame("r")["loss"].tolist() == [1.0]
    store.append_metrics("r", [{"step": 2, "loss": 0.5}])
    assert store.metrics_frame("r")["loss"].tolist() == [1.0, 0.5]  # running: read each time
    store.finish_run("r", RunStatus.COMPLETED)
    first = store.metrics_frame("r")
    first.loc[0, "loss"] = 99.0  # a page changing its copy changes nobody else's
    assert store.metrics_frame("r")["loss"].tolist() == [1.0, 0.5]
    assert store._finished_frame.cache_info().hits == 1


def test_column_wise_frame_equals_the_row_wise_one(store):
    """The Arrow read: the same values and order as the row-wise read, also for a column that is NULL for
    more rows than one of ADBC's default batches before it has values (SQLite infers column types)."""
    assert store._arrow_connect is not None, "the column-wise reader is not in use on this backend"
    store.create_run(RunRecord(id="r", status=RunStatus.RUNNING.value))
    rng = random.Random(3)
    rows = [{"step": step, "loss": rng.uniform(0, 3), "tokens_seen": 64 * step, "wall_time": 1.7e9 + step,
             "grad_norm": rng.uniform(0, 2) if step > 2500 else None,
             "nonfinite": "eval_loss" if step % 997 == 0 else ""} for step in range(3000, 0, -1)]
    store.append_metrics("r", rows)
    column_wise = store._read_arrow("r")
    assert column_wise is not None and list(column_wise.columns) == ["step", *METRIC_FIELDS]
    row_wise = store._read_frame("r", from_step=0)  # from_step: always the row-wise read
    assert rows_from_frame(column_wise) == rows_from_frame(row_wise)
    assert column_wise["step"].tolist() == list(range(1, 3001))
    assert column_wise["grad_norm"].iloc[2500] == rows[499]["grad_norm"] and column_wise["grad_norm"].iloc[:2500].isna().all()
    assert column_wise.loc[column_wise["step"] == 997, "nonfinite"].tolist() == ["eval_loss"]


def test_metrics_frame_reads_only_the_columns_asked_for(store, monkeypatch):
    store.create_run(RunRecord(id="r", status=RunStatus.RUNNING.value))
    store.append_metrics("r", [{"step": 2, "loss": 0.5, "tokens_seen": 128, "grad_norm": 1.0},
                               {"step": 1, "loss": 1.0, "eval_loss": 1.2, "tokens_seen": 64}])
    store.finish_run("r", RunStatus.COMPLETED)
    full = store.metrics_frame("r")
    few = store.metrics_frame("r", columns=["tokens_seen", "loss", "step"])
    assert list(few.columns) == ["step", "loss", "tokens_seen"]  # table order, step first
    assert rows_from_frame(few) == rows_from_frame(full[["step", "loss", "tokens_seen"]])
    assert list(store.metrics_frame("r").columns) == ["step", *METRIC_FIELDS]  # its own cache entry
    monkeypatch.setattr(store, "_arrow_connect", None)  # the row-wise read gives the same columns
    store._finished_frame.cache_clear()
    assert rows_from_frame(store.metrics_frame("r", columns=["tokens_seen", "loss"])) == rows_from_frame(few)
    with pytest.raises(ValueError, match="'los' is not a metric field; choose from epoch, loss"):
        store.metrics_frame("r", columns=["los"])


def test_frame_read_row_by_row_when_the_column_wise_driver_refuses(store, monkeypatch):
    import adbc_driver_manager

    store.create_run(RunRecord(id="r", status=RunStatus.RUNNING.value))
    store.append_metrics("r", [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5, "nonfinite": "eval_loss"}])

    def refuse():
        raise adbc_driver_manager.OperationalError("server closed the connection unexpectedly",
                                                   status_code=adbc_driver_manager.AdbcStatusCode.IO)

    monkeypatch.setattr(store, "_arrow_connect", refuse)
    frame = store.metrics_frame("r")
    assert frame["loss"].tolist() == [1.0, 0.5] and frame["nonfinite"].tolist() == ["", "eval_loss"]
    assert store.metrics_frame("missing").empty  # no rows: the row-wise read's empty frame


# ====================================================================== a run pumped by another process
def test_incremental_view_of_a_run_pumped_elsewhere_equals_a_full_rebuild(home, store, monkeypatch):
    """The view reads only rows from the last step it saw; alerts are not replayed; the result equals
    a rebuild from all stored rows (values, merged eval rows, alerts, progress)."""
    store.create_run(RunRecord(id="remote", name="cli run", status=RunStatus.RUNNING.value, created_at=time.time(),
                         total_steps=400, pid=os.getpid(), pid_started_at=psutil.Process().create_time()))
    run_dir = paths.run_dir("remote")
    run_dir.mkdir(parents=True)
    pumping_elsewhere = adoption.try_lock(run_dir)  # what the CLI's orchestrator holds while it pumps
    viewer = Orchestrator(store=store, start_pump=False)  # a dashboard that does not pump this run
    reads: list[int | None] = []
    real = store.metric_rows

    def metric_rows(run_id, from_step=None):
        reads.append(from_step)
        return real(run_id, from_step)

    monkeypatch.setattr(store, "metric_rows", metric_rows)
    rng = random.Random(7)
    step = 0
    try:
        for batch in range(12):
            rows = []
            for _ in range(rng.randint(1, 40)):
                step += 1
                spike = step in (120, 121, 200)
                row = {"step": step, "loss": float("nan") if step in (50, 51) else rng.uniform(1, 2),
                       "grad_norm": rng.uniform(0.5, 1.5) * (40 if spike else 1), "wall_time": float(step)}
                row["nonfinite"] = "loss" if step in (50, 51) else ""
                if step in (50, 51):
                    row["loss"] = None
                rows.append(row)
            # the eval of the last step arrives in the next batch, merging into a row already read
            store.append_metrics("remote", rows, steps_done=step)
            snap = viewer.snapshot("remote")
            assert snap.step == step and snap.metrics["step"].iloc[-1] == step
            store.append_metrics("remote", [{"step": step, "eval_loss": 3.0 - batch * 0.1 if batch < 6
                                             else 2.0 + batch * 0.1}])
        incremental = viewer.snapshot("remote")
        incremental_reads = list(reads)  # the rebuild below reads everything
        rebuilt = adoption.rebuild_view(store.get_run("remote"), store)[0].snapshot()
    finally:
        viewer.close()
        pumping_elsewhere.close()
    assert not viewer._is_tracked("remote")
    # Same rows and values (the frame built in pieces may hold a column as object where one read holds float).
    assert rows_from_frame(incremental.metrics) == rows_from_frame(rebuilt.metrics)
    assert len(incremental.metrics) == step
    assert incremental.alerts == rebuilt.alerts
    assert sorted(a.kind for a in incremental.alerts) == ["eval_rising", "grad_spike", "grad_spike", "nonfinite_loss"]
    assert incremental.step == rebuilt.step == step
    # After the first build, each refresh read from the last step it had seen: new rows only.
    assert incremental_reads[0] is None and all(r is not None for r in incremental_reads[1:])
    assert incremental_reads[1:] == sorted(incremental_reads[1:]) and len(incremental_reads) == 13
