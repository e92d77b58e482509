"""The store (the one write path to the database), its metric buffer, and the run-status enum."""
from __future__ import annotations


import pandas as pd
import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

import db.store as store_mod
from db.entities import RunRecord
from db.models import Metric, MetricValue
from tests.support.factories import stored_run
from trainer_core.jobs.pump import MetricBuffer
from trainer_core.protocol.metrics import METRIC_FIELDS
from trainer_core.protocol.status import RunStatus


# ---------------------------------------------------------------------- status enum
@pytest.mark.parametrize("status, terminal", [
    (RunStatus.QUEUED, False), (RunStatus.STARTING, False), (RunStatus.RUNNING, False), (RunStatus.STOPPING, False),
    (RunStatus.COMPLETED, True), (RunStatus.STOPPED, True), (RunStatus.CANCELLED, True), (RunStatus.FAILED, True),
])
def test_status_is_terminal(status, terminal):
    assert status.is_terminal() is terminal


def test_status_is_closed_and_round_trips_through_its_value():
    assert [s.value for s in RunStatus] == ["queued", "starting", "running", "stopping", "completed", "stopped",
                                            "cancelled", "failed"]
    for status in RunStatus:
        assert RunStatus(status.value) is status
        assert status.label and status.icon
    with pytest.raises(ValueError):
        RunStatus("Stopped (saved)")  # display text is never parsed back


# ---------------------------------------------------------------------- runs
def test_sqlite_runs_in_wal_mode(store):
    if not store.is_sqlite:
        pytest.skip("WAL is a SQLite setting")
    with store.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1


def test_default_url_uses_data_root_or_database_url(home, monkeypatch):
    assert store_mod.default_url() == f"sqlite:///{home.resolve() / 'studio.db'}"
    monkeypatch.setenv("DATABASE_URL", "postgres://u:p@db/studio")
    assert store_mod.default_url() == "postgresql://u:p@db/studio"
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://u:p@db/studio")
    assert store_mod.default_url() == "postgresql+psycopg://u:p@db/studio"


def test_create_get_and_list_runs(store):
    stored_run(store, "old", RunStatus.COMPLETED, created_at=1.0)
    made = stored_run(store, "new", RunStatus.QUEUED, created_at=2.0, model="m", total_steps=60)
    assert made.id == "new"
    got = store.get_run("new")
    assert (got.name, got.status, got.model, got.total_steps, got.steps_done, got.event_offset) == (
        "run new", "queued", "m", 60, 0, 0)
    assert store.get_run("missing") is None
    assert [r.id for r in store.list_runs()] == ["new", "old"]
    assert [r.id for r in store.list_runs(limit=1)] == ["new"]
    assert store.active_runs() == []  # queued runs have no worker yet
    assert [r.id for r in store.queued_runs()] == ["new"]
    events = store.get_events("new")
    assert [(e.kind, e.message, e.ts) for e in events] == [("status", "Queued", 2.0)]


def test_update_run_changes_fields(store):
    stored_run(store)
    store.update_run("r1", phase="training", pid=123, steps_done=4)
    run = store.get_run("r1")
    assert (run.phase, run.pid, run.steps_done) == ("training", 123, 4)
    store.update_run("missing", phase="x")  # no-op, no error
    assert store.get_run("missing") is None


def test_update_run_does_not_change_a_finished_run(store):
    stored_run(store)
    assert store.finish_run("r1", RunStatus.COMPLETED, finished_at=50.0, steps_done=10)
    store.update_run("r1", status="running", steps_done=3, finished_at=None)
    run = store.get_run("r1")
    assert (run.status, run.steps_done, run.finished_at) == ("completed", 10, 50.0)


def test_finish_run_is_idempotent(store):
    stored_run(store)
    assert store.finish_run("r1", RunStatus.FAILED, finished_at=200.0, error="OOM\nat line 3") is True
    assert store.finish_run("r1", RunStatus.COMPLETED, finished_at=300.0, final_loss=0.1) is False
    run = store.get_run("r1")
    assert (run.status, run.finished_at, run.error, run.final_loss) == ("failed", 200.0, "OOM\nat line 3", None)
    assert [(e.kind, e.message) for e in store.get_events("r1")] == [("status", "Training"),
                                                                    ("status", "Failed: OOM")]
    assert store.active_runs() == []


def test_finish_run_refuses_non_terminal_status_and_unknown_run(store):
    stored_run(store)
    with pytest.raises(ValueError, match="not a terminal status"):
        store.finish_run("r1", RunStatus.STOPPING)
    assert store.get_run("r1").status == "running"
    assert store.finish_run("missing", RunStatus.COMPLETED) is False


def test_delete_run_refuses_live_runs_and_removes_everything(store):
    stored_run(store, "live", RunStatus.RUNNING)
    stored_run(store, "done", RunStatus.RUNNING)
    store.append_metrics("done", [{"step": 1, "loss": 2.0}], events=[(1.0, "warning", "hm")])
    store.append_metrics("live", [{"step": 1, "loss": 3.0}])
    store.finish_run("done", RunStatus.STOPPED)

    with pytest.raises(ValueError, match="stop or cancel it before deleting"):
        store.delete_run("live")
    assert store.get_run("live") is not None

    assert store.delete_run("done") is True
    assert store.get_run("done") is None
    assert store.metrics_frame("done").empty
    assert store.get_events("done") == []
    assert store.delete_run("done") is False
    # the other run is untouched
    assert store.metrics_frame("live")["loss"].tolist() == [3.0]


# ---------------------------------------------------------------------- metrics
def test_metrics_frame_columns_and_order(store):
    stored_run(store)
    assert list(store.metrics_frame("r1").columns) == ["step", *METRIC_FIELDS]
    assert list(METRIC_FIELDS) == ["epoch", "loss", "eval_loss", "learning_rate", "grad_norm", "tokens_seen",
                                   "tokens_per_s", "memory_mb", "elapsed_s", "wall_time", "nonfinite"]
    store.append_metrics("r1", [{"step": 3, "loss": 1.0}, {"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}])
    frame = store.metrics_frame("r1")
    assert frame["step"].tolist() == [1, 2, 3]
    assert frame["loss"].tolist() == [3.0, 2.0, 1.0]


def test_same_step_twice_gives_one_row(store):
    stored_run(store)
    store.append_metrics("r1", [{"step": 5, "loss": 1.0, "learning_rate": 1e-4}])
    store.append_metrics("r1", [{"step": 5, "loss": 0.8, "learning_rate": 1e-4}])  # replay after re-attach
    store.append_metrics("r1", [{"step": 6, "loss": 0.7}, {"step": 6, "loss": 0.6}])  # twice in one batch
    frame = store.metrics_frame("r1")
    assert frame["step"].tolist() == [5, 6]
    assert frame["loss"].tolist() == [0.8, 0.6]


def test_eval_row_merges_into_train_row_without_erasing_it(store):
    stored_run(store)
    store.append_metrics("r1", [{"step": 10, "epoch": 0.5, "loss": 1.2, "learning_rate": 2e-4, "grad_norm": 0.3,
                                 "wall_time": 11.0, "nonfinite": ""}])
    store.append_metrics("r1", [{"step": 10, "eval_loss": 1.4, "wall_time": 12.0, "nonfinite": ""}])
    row = store.metrics_frame("r1").iloc[0].to_dict()
    assert row["step"] == 10
    assert (row["epoch"], row["loss"], row["eval_loss"], row["learning_rate"], row["grad_norm"]) == (
        0.5, 1.2, 1.4, 2e-4, 0.3)
    assert row["wall_time"] == 12.0
    assert row["nonfinite"] == ""


def test_nonfinite_names_are_stored_and_kept_by_a_later_clean_row(store):
    stored_run(store)
    store.append_metrics("r1", [{"step": 1, "loss": None, "nonfinite": "loss"}])
    store.append_metrics("r1", [{"step": 1, "eval_loss": 2.0, "nonfinite": ""}])
    row = store.metrics_frame("r1").iloc[0]
    assert row["nonfinite"] == "loss"
    assert pd.isna(row["loss"])
    assert row["eval_loss"] == 2.0


def test_keys_besides_the_wide_fields_are_open_metrics(store):
    """Metrics are open (issue 18): a key that is not a wide column is kept in the long table, not dropped."""
    stored_run(store)
    store.append_metrics("r1", [{"step": "2", "loss": 1.0, "total_steps": 60, "eta_s": 3.0}])
    frame = store.metrics_frame("r1")
    assert frame["step"].tolist() == [2]
    assert frame["loss"].tolist() == [1.0]
    assert list(frame.columns) == ["step", *METRIC_FIELDS, "eta_s", "total_steps"]
    assert (frame["eta_s"].tolist(), frame["total_steps"].tolist()) == ([3.0], [60.0])


# ---------------------------------------------------------------------- open metrics (the long table)
def test_open_metrics_are_upserted_on_run_step_and_key_and_merged_with_the_wide_row(store):
    stored_run(store)
    store.append_metrics("r1", [{"step": 1, "loss": 2.0, "rewards/format/mean": 0.25, "logps/rejected": -40.0},
                                {"step": 2, "loss": 1.5, "rewards/format/mean": 0.5}])
    # a replay of step 2 with one more key, an eval row of step 1 with its own key, two rows of step 3 in one batch
    store.append_metrics("r1", [{"step": 2, "loss": 1.5, "rewards/format/mean": 0.5, "rewards/chosen": 1.0},
                                {"step": 1, "eval_loss": 2.2, "eval_runtime": 3.5},
                                {"step": 3, "loss": 1.0, "rewards/format/mean": 0.6},
                                {"step": 3, "rewards/format/mean": 0.7}])
    frame = store.metrics_frame("r1")
    assert list(frame.columns) == ["step", *METRIC_FIELDS, "eval_runtime", "logps/rejected", "rewards/chosen",
                                   "rewards/format/mean"]
    extra = frame[["step", "loss", "eval_loss", "rewards/format/mean", "rewards/chosen", "logps/rejected",
                   "eval_runtime"]].astype(object).where(frame.notna(), None).values.tolist()
    assert extra == [[1, 2.0, 2.2, 0.25, None, -40.0, 3.5], [2, 1.5, None, 0.5, 1.0, None, None],
                     [3, 1.0, None, 0.7, None, None, None]]
    assert store.metric_keys("r1") == ["eval_runtime", "logps/rejected", "rewards/chosen", "rewards/format/mean"]
    # a page reads what it draws: the wide columns it names and the keys it names, in the order asked for
    few = store.metrics_frame("r1", columns=["loss"], keys=["rewards/format/mean", "not logged", "eval_runtime"])
    assert list(few.columns) == ["step", "loss", "rewards/format/mean", "eval_runtime"]
    assert list(store.metrics_frame("r1", columns=["loss"]).columns) == ["step", "loss"]
    later = store.metrics_frame("r1", from_step=2, columns=["loss"], keys=["rewards/chosen"])
    assert (later["step"].tolist(), later["rewards/chosen"].fillna(-1).tolist()) == ([2, 3], [1.0, -1])
    rows = store.metric_rows("r1", from_step=2)
    assert [(r["step"], r["loss"], r.get("rewards/format/mean"), r.get("rewards/chosen")) for r in rows] == \
        [(2, 1.5, 0.5, 1.0), (3, 1.0, 0.7, None)]


def test_open_metrics_commit_with_the_offset_or_not_at_all(store):
    stored_run(store)
    store.append_metrics("r1", [{"step": 1, "loss": 1.0, "rewards/chosen": 0.1}], event_offset=100)
    with pytest.raises(ValueError, match="no field \"bogus\""):
        store.append_metrics("r1", [{"step": 2, "loss": 0.5, "rewards/chosen": 0.2}], event_offset=200, bogus=1)
    assert store.get_run("r1").event_offset == 100
    assert store.metrics_frame("r1")["rewards/chosen"].tolist() == [0.1]


def test_a_batch_of_open_metrics_from_the_buffer_and_deleting_the_run(store):
    stored_run(store, status=RunStatus.COMPLETED)
    buf = MetricBuffer(max_rows=1000)
    for step in range(1, 1202):
        buf.add({"step": step, "loss": 1.0 / step, "rewards/format/mean": step / 1000, "kl": 0.01 * step})
    store.append_metrics("r1", buf.take(), event_offset=7)
    frame = store.metrics_frame("r1")
    assert frame["rewards/format/mean"].tolist() == [step / 1000 for step in range(1, 1202)]
    assert frame["kl"].iloc[-1] == pytest.approx(12.01)
    assert store.delete_run("r1") is True
    assert store.metric_keys("r1") == [] and store.metric_rows("r1") == []


def test_open_metric_table_key_is_run_key_and_step():
    assert [c.name for c in MetricValue.__table__.primary_key.columns] == ["run_id", "key", "step"]


def test_many_rows_are_written_in_chunks(store):
    stored_run(store)
    store.append_metrics("r1", [{"step": i, "loss": float(i)} for i in range(1, 1202)])
    frame = store.metrics_frame("r1")
    assert len(frame) == 1201
    assert frame["step"].tolist() == list(range(1, 1202))


def test_append_metrics_advances_offset_and_updates_progress(store):
    stored_run(store)
    store.append_metrics("r1", [{"step": 1, "loss": 1.0}], event_offset=321, steps_done=1, last_loss=1.0,
                         events=[(150.0, "warning", "slow tokenizer")])
    run = store.get_run("r1")
    assert (run.event_offset, run.steps_done, run.last_loss) == (321, 1, 1.0)
    assert [(e.kind, e.message) for e in store.get_events("r1")] == [("status", "Training"),
                                                                    ("warning", "slow tokenizer")]
    # offset only, no rows
    store.append_metrics("r1", [], event_offset=400)
    assert store.get_run("r1").event_offset == 400


def test_append_metrics_is_one_transaction(store):
    stored_run(store)
    store.append_metrics("r1", [{"step": 1, "loss": 1.0}], event_offset=100, steps_done=1)
    # the upsert has run when the bad run field fails: rows, event, offset and progress must all roll back
    with pytest.raises(ValueError, match="no field \"bogus\""):
        store.append_metrics("r1", [{"step": 2, "loss": 0.5}], event_offset=200, steps_done=2, bogus=1,
                             events=[(150.0, "warning", "lost")])
    run = store.get_run("r1")
    assert (run.event_offset, run.steps_done) == (100, 1)
    assert store.metrics_frame("r1")["step"].tolist() == [1]
    assert [e.kind for e in store.get_events("r1")] == ["status"]


def test_append_metrics_never_changes_a_terminal_run_but_still_advances_offset(store):
    stored_run(store, steps_done=0)
    store.finish_run("r1", RunStatus.STOPPED, finished_at=9.0, steps_done=7)
    store.append_metrics("r1", [{"step": 8, "loss": 0.4}], event_offset=999, steps_done=8, status="running",
                         finished_at=None)
    run = store.get_run("r1")
    assert (run.status, run.steps_done, run.finished_at, run.event_offset) == ("stopped", 7, 9.0, 999)
    assert store.metrics_frame("r1")["step"].tolist() == [8]


def test_a_stopping_run_is_not_set_back_to_running_by_a_status_read_before_the_request(store):
    """The pump may read the worker's "running" event just before a Stop or Cancel is written (by this dashboard or
    another process); its next flush set the row back to running, where it stayed while the worker ignored it."""
    stored_run(store, status=RunStatus.STOPPING, steps_done=0, phase="cancelling")
    store.append_metrics("r1", [{"step": 1, "loss": 0.4}], event_offset=10, steps_done=1, status="running",
                         phase="training")
    run = store.get_run("r1")
    assert (run.status, run.phase, run.steps_done, run.event_offset) == (RunStatus.STOPPING, "cancelling", 1, 10)
    store.append_metrics("r1", [], status="stopping", phase="saving")  # what the worker says once it stops
    assert (store.get_run("r1").status, store.get_run("r1").phase) == (RunStatus.STOPPING, "saving")


def test_metrics_for_an_unknown_run_are_refused(store):
    with pytest.raises(IntegrityError):
        store.append_metrics("ghost", [{"step": 1, "loss": 1.0}])


def test_loss_series_skips_missing_losses_and_is_per_run(store):
    stored_run(store, "a", created_at=1.0)
    stored_run(store, "b", created_at=2.0)
    stored_run(store, "c", created_at=3.0)
    store.append_metrics("a", [{"step": 2, "loss": 2.0}, {"step": 1, "loss": 3.0}, {"step": 3, "eval_loss": 9.0}])
    store.append_metrics("b", [{"step": 1, "loss": 5.0}])
    assert store.loss_series(["a", "b", "c"]) == {"a": [3.0, 2.0], "b": [5.0], "c": []}
    assert store.loss_series([]) == {}


def test_loss_series_thins_to_max_points_keeping_first_and_last(store):
    stored_run(store)
    store.append_metrics("r1", [{"step": i, "loss": float(i)} for i in range(100)])
    thinned = store.loss_series(["r1"], max_points=10)["r1"]
    assert thinned == [0.0, 11.0, 22.0, 33.0, 44.0, 55.0, 66.0, 77.0, 88.0, 99.0]
    assert len(store.loss_series(["r1"])["r1"]) == 60
    assert store.loss_series(["r1"], max_points=100)["r1"] == [float(i) for i in range(100)]
    assert store.loss_series(["r1"], max_points=2)["r1"] == [0.0, 99.0]
    assert store.loss_series(["r1"], max_points=1)["r1"] == [99.0]


def test_buffer_rows_go_into_the_store(store):
    stored_run(store)
    buf = MetricBuffer(max_rows=2)
    buf.add({"step": 1, "loss": 1.0})
    buf.add({"step": 1, "eval_loss": 1.1})
    buf.add({"step": 2, "loss": 0.9})
    assert buf.due()
    store.append_metrics("r1", buf.take(), event_offset=42)
    frame = store.metrics_frame("r1")
    assert frame[["step", "loss"]].values.tolist() == [[1, 1.0], [2, 0.9]]
    assert frame["eval_loss"].tolist()[0] == 1.1
    assert store.get_run("r1").event_offset == 42


def test_metric_model_primary_key_is_run_and_step():
    assert [c.name for c in Metric.__table__.primary_key.columns] == ["run_id", "step"]


def test_nonfinite_names_of_one_step_are_united_across_batches_and_within_one(store):
    store.create_run(RunRecord(id="nf", name="nf", status="running", created_at=1.0))
    store.append_metrics("nf", [{"step": 1, "loss": None, "nonfinite": "loss"}])
    store.append_metrics("nf", [{"step": 1, "eval_loss": None, "nonfinite": "eval_loss"},
                                {"step": 2, "loss": 1.0, "nonfinite": ""},
                                {"step": 2, "eval_loss": None, "nonfinite": "eval_loss"}])
    store.append_metrics("nf", [{"step": 1, "loss": None, "nonfinite": "loss"}])  # replay: no duplicate name
    frame = store.metrics_frame("nf").set_index("step")
    assert sorted(frame.loc[1, "nonfinite"].split(",")) == ["eval_loss", "loss"]
    assert frame.loc[2, "nonfinite"] == "eval_loss" and frame.loc[2, "loss"] == 1.0
