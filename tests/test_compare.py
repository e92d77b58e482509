"""Compare view: config diff and summary table as plain functions, and the page through AppTest."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
from streamlit import dataframe_util
from streamlit.testing.v1 import AppTest

from db.entities import RunRecord
from db.store import Store
from tests.support.factories import run_record
from trainer_core.protocol.status import RunStatus
from ui.compare import config_diff, summary_table

ROOT = Path(__file__).resolve().parent.parent
PAGE = str(ROOT / "pages" / "compare.py")
TIMEOUT = 30
BASE_CONFIG = {"model": "tiny-model", "learning_rate": 2e-4, "lora_r": 8, "datasets": ["a.jsonl"], "seed": 42}


# ---------------------------------------------------------------------- config_diff
def test_config_diff_keeps_only_fields_that_differ():
    diff = config_diff({
        "alpha": BASE_CONFIG,
        "beta": {**BASE_CONFIG, "learning_rate": 1e-4, "datasets": ["a.jsonl", "b.jsonl"]},
        "gamma": {**BASE_CONFIG, "lora_r": 16},
    })
    assert list(diff.columns) == ["alpha", "beta", "gamma"]
    assert diff.index.name == "field"
    assert diff.to_dict("index") == {
        "learning_rate": {"alpha": "0.0002", "beta": "0.0001", "gamma": "0.0002"},
        "lora_r": {"alpha": "8", "beta": "8", "gamma": "16"},
        "datasets": {"alpha": '["a.jsonl"]', "beta": '["a.jsonl", "b.jsonl"]', "gamma": '["a.jsonl"]'},
    }


def test_config_diff_marks_missing_fields_and_is_empty_for_equal_configs():
    diff = config_diff({"a": {"x": 1, "y": {"k": 1}}, "b": {"x": 1}})
    assert diff.to_dict("index") == {"y": {"a": '{"k": 1}', "b": "—"}}
    same = config_diff({"a": BASE_CONFIG, "b": dict(BASE_CONFIG)})
    assert same.empty and list(same.columns) == ["a", "b"]


# ---------------------------------------------------------------------- summary_table
def compared(run_id: str, name: str, status: RunStatus = RunStatus.COMPLETED, **values) -> RunRecord:
    """A run row of the compare table: created and started at t=1000 s."""
    return run_record(run_id, status, name=name, created_at=1000.0, started_at=1000.0, **values)


def test_summary_table_reads_losses_from_the_metrics():
    runs = [compared("r1", "alpha", steps_done=4, finished_at=1125.0, tokens_seen=4096),
            compared("r2", "beta", RunStatus.FAILED, steps_done=2, finished_at=1010.0, final_loss=7.0)]
    frames = {
        "r1": pd.DataFrame({"step": [1, 2, 3, 4], "loss": [3.0, 1.5, None, 2.0],
                            "eval_loss": [None, 2.5, None, 2.25]}, dtype=object),
        "r2": pd.DataFrame({"step": [1, 2], "loss": [5.0, float("nan")], "eval_loss": [None, None]}),
    }
    table = summary_table(runs, frames, now=2000.0).set_index("run")
    alpha, beta = table.loc["alpha"], table.loc["beta"]
    assert (alpha["final loss"], alpha["best loss"], alpha["final eval loss"], alpha["best eval loss"]) == \
        (2.0, 1.5, 2.25, 2.25)
    assert (alpha["steps"], alpha["tokens seen"], alpha["duration"], alpha["status"]) == \
        (4, 4096, "2m 05s", "✅ Completed")
    assert (beta["final loss"], beta["best loss"]) == (5.0, 5.0)
    assert pd.isna(beta["final eval loss"]) and pd.isna(beta["best eval loss"])
    assert (beta["duration"], beta["status"]) == ("10s", "❌ Failed")


def test_summary_table_falls_back_to_the_run_row_and_counts_running_time():
    runs = [compared("r3", "gamma", RunStatus.RUNNING, steps_done=9, last_loss=1.25, best_eval_loss=1.5)]
    row = summary_table(runs, {}, now=1061.0).iloc[0]
    assert (row["final loss"], row["best loss"], row["best eval loss"], row["steps"], row["duration"]) == \
        (1.25, 1.25, 1.5, 9, "1m 01s")


# ---------------------------------------------------------------------- the page
def insert_run(store: Store, run_id: str, name: str, losses: list[float], evals: dict[int, float],
               config: dict, tokens_per_step: int = 100) -> None:
    now = time.time()
    store.create_run(RunRecord(id=run_id, name=name, status=RunStatus.RUNNING.value, model="tiny-model",
                         dataset="demo.jsonl", method="LoRA", created_at=now - 60, started_at=now - 50,
                         total_steps=len(losses), config_json=json.dumps(config)))
    rows = [{"step": i + 1, "loss": loss, "tokens_seen": tokens_per_step * (i + 1)} for i, loss in enumerate(losses)]
    for step, value in evals.items():
        rows[step - 1]["eval_loss"] = value
    store.append_metrics(run_id, rows)
    store.finish_run(run_id, RunStatus.COMPLETED, steps_done=len(losses), final_loss=losses[-1],
                     tokens_seen=tokens_per_step * len(losses))


def three_runs() -> None:
    store = Store()
    insert_run(store, "run-a", "alpha", [3.0, 2.0, 1.0], {2: 2.5, 3: 1.5}, BASE_CONFIG)
    insert_run(store, "run-b", "beta", [4.0, 3.5, 3.0], {3: 3.2}, {**BASE_CONFIG, "learning_rate": 1e-4})
    insert_run(store, "run-c", "gamma", [9.0, 8.0], {}, {**BASE_CONFIG, "lora_r": 16}, tokens_per_step=300)


def open_compare(query_runs: list[str] | None = None, **session) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.session_state["_studio_entered"] = True  # as if the entry point ran (it is not registered there yet)
    for key, value in session.items():
        at.session_state[key] = value
    if query_runs:
        at.query_params["run"] = query_runs
    at.run()
    assert not at.exception, at.exception
    return at


def chart_data(chart) -> pd.DataFrame:
    (dataset,) = chart.proto.datasets
    return dataframe_util.convert_arrow_bytes_to_pandas_df(dataset.data.data)


def test_compare_page_draws_charts_table_and_diff(app_home):
    three_runs()
    at = open_compare(["run-a", "run-b", "run-c"])
    charts = at.get("vega_lite_chart")
    assert len(charts) == 2  # train loss and eval loss
    loss_spec, eval_spec = (json.loads(c.proto.spec) for c in charts)
    assert loss_spec["title"] == "Train loss" and eval_spec["title"] == "Eval loss"
    assert loss_spec["layer"][0]["encoding"]["color"]["scale"]["domain"] == ["alpha", "beta", "gamma"]
    assert [layer["mark"]["type"] for layer in loss_spec["layer"]] == ["line", "line", "line", "rule"]
    loss = chart_data(charts[0])
    # default smoothing: moving average over 10 logged steps
    assert loss[loss["series"] == "alpha"]["value"].tolist() == [3.0, 2.5, 2.0]
    assert loss[loss["series"] == "gamma"]["value"].tolist() == [9.0, 8.5]
    evals = chart_data(charts[1])
    assert evals[evals["series"] == "alpha"][["step", "value"]].values.tolist() == [[2, 2.5], [3, 1.5]]
    assert set(evals["series"]) == {"alpha", "beta"}

    table = at.dataframe[0].value.set_index("run")
    assert table["final loss"].to_dict() == {"alpha": 1.0, "beta": 3.0, "gamma": 8.0}
    assert table["best eval loss"].to_dict()["alpha"] == 1.5
    assert table["tokens seen"].to_dict() == {"alpha": 300, "beta": 300, "gamma": 600}

    diff = at.dataframe[1].value
    assert sorted(diff.index) == ["learning_rate", "lora_r"]
    assert diff.loc["learning_rate"].to_dict() == {"alpha": "0.0002", "beta": "0.0001", "gamma": "0.0002"}
    assert diff.loc["lora_r"].to_dict() == {"alpha": "8", "beta": "8", "gamma": "16"}


def test_compare_page_aligns_by_tokens_and_switches_to_ema(app_home):
    three_runs()
    at = open_compare(compare_ids=["run-a", "run-c"])
    at.radio(key="cmp_align").set_value("tokens_seen").run()
    at.radio(key="cmp_smoothing").set_value("ema").run()
    at.slider(key="cmp_ema").set_value(0.0).run()
    assert not at.exception, at.exception
    loss = chart_data(at.get("vega_lite_chart")[0])
    assert loss[loss["series"] == "gamma"][["tokens_seen", "value"]].values.tolist() == [[300, 9.0], [600, 8.0]]
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    assert spec["layer"][0]["encoding"]["x"]["field"] == "tokens_seen"


def test_compare_page_asks_for_two_to_six_runs(app_home):
    three_runs()
    at = open_compare()
    assert any("Pick 2 to 6 runs" in i.value for i in at.info)
    assert not at.get("vega_lite_chart")
    at.multiselect(key="compare_pick").select("run-a").run()
    assert any("(1 picked)" in i.value for i in at.info)
    at.multiselect(key="compare_pick").select("run-b").run()
    assert not at.exception, at.exception
    assert len(at.get("vega_lite_chart")) == 2
    assert at.session_state["compare_ids"] == ["run-a", "run-b"]
    assert at.query_params["run"] == ["run-a", "run-b"]


def test_compare_page_without_runs_says_so(app_home):
    at = open_compare()
    assert any("No runs yet" in i.value for i in at.info)
