"""The Streamlit pages, driven through AppTest against an isolated data root."""
from __future__ import annotations

import time

import pandas as pd
import pytest
from streamlit import dataframe_util
from streamlit.testing.v1 import AppTest

from db.store import Store
from tests.support import MODELS_CACHE
from tests.support.apptest import TIMEOUT, open_page, submit, texts
from tests.support.factories import insert_finished_run
from trainer_core.jobs.live import LiveSnapshot
from trainer_core.protocol.metrics import METRIC_COLUMNS
from trainer_core.protocol.status import RunStatus
from ui import format as fmt
from ui.state import get_orchestrator


def chart_frames(at: AppTest) -> list[pd.DataFrame]:
    return [dataframe_util.convert_arrow_bytes_to_pandas_df(d.data.data)
            for chart in at.get("vega_lite_chart") for d in chart.proto.datasets]


# ---------------------------------------------------------------------- New run
def test_new_run_shows_every_validation_error_and_starts_nothing(app_home):
    at = open_page("pages/new_run.py")
    at.number_input(key="nr_learning_rate").set_value(0.0)
    at.number_input(key="nr_batch_size").set_value(0)
    at.text_input(key="nr_hf_token").input("hf_SECRET_value_123")
    submit(at)
    errors = texts(at, "error")
    assert any(e.startswith("**learning_rate**:") for e in errors), errors
    assert any(e.startswith("**batch_size**:") for e in errors), errors
    assert not any("hf_SECRET_value_123" in e for e in errors + texts(at, "markdown") + texts(at, "warning"))
    assert Store().list_runs() == []


def test_new_run_reports_form_parsing_and_config_errors_together(app_home):
    at = open_page("pages/new_run.py")
    at.text_area(key="nr_custom_format_mapping").input("instruction=question\nnot a mapping line")
    at.number_input(key="nr_lora_r").set_value(0)
    submit(at)
    errors = texts(at, "error")
    assert any(e.startswith("**custom_format_mapping**:") and "line 2" in e for e in errors), errors
    assert any(e.startswith("**lora_r**:") for e in errors), errors
    assert Store().list_runs() == []


def test_qlora_on_cpu_shows_the_cuda_message(app_home):
    at = open_page("pages/new_run.py")
    at.selectbox(key="nr_adapter").set_value("qlora")
    submit(at)
    errors = texts(at, "error")
    assert any(e.startswith("**adapter**:") and "CUDA" in e for e in errors), errors
    assert Store().list_runs() == []


def test_new_run_reports_a_broken_local_dataset_by_field(app_home, tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n")
    at = open_page("pages/new_run.py")
    at.radio(key="nr_dataset_source").set_value("local")
    at.text_input(key="nr_local_datasets").input(str(broken))
    submit(at)
    errors = texts(at, "error")
    assert any(e.startswith("**local_datasets**:") and "broken.jsonl" in e for e in errors), errors
    assert Store().list_runs() == []


def test_new_run_asks_for_a_file_when_upload_is_chosen_without_one(app_home):
    at = open_page("pages/new_run.py")
    at.radio(key="nr_dataset_source").set_value("upload")
    submit(at)
    assert any(e.startswith("**local_datasets**:") and "upload" in e for e in texts(at, "error"))
    assert Store().list_runs() == []


# ---------------------------------------------------------------------- History and run details
def test_history_lists_runs_from_the_database(app_home):
    store = Store()
    insert_finished_run(store, "run-a", "alpha run", [2.0, 1.5, 1.2])
    insert_finished_run(store, "run-b", "beta run", [3.0, 2.9], status=RunStatus.FAILED, error="CUDA OOM")
    at = open_page("pages/history.py")
    table = at.dataframe[0].value
    assert set(table["name"]) == {"alpha run", "beta run"}
    by_name = table.set_index("name")
    assert by_name.loc["alpha run", "status"] == "✅ Completed"
    assert by_name.loc["beta run", "status"] == "❌ Failed"
    assert by_name.loc["alpha run", "steps"] == "3 / 3"
    assert list(by_name.loc["alpha run", "loss"]) == [2.0, 1.5, 1.2]
    assert by_name.loc["alpha run", "final loss"] == pytest.approx(1.2)


def test_history_open_goes_to_the_run_page(app_home):
    insert_finished_run(Store(), "run-a", "alpha run", [2.0, 1.5, 1.2])
    at = open_page("pages/history.py")
    next(b for b in at.button if b.label == "Open").click().run()
    assert not at.exception, at.exception
    assert at.session_state["detail_run_id"] == "run-a"
    assert any(t.value == "Run details" for t in at.title)


def test_run_page_draws_charts_from_the_database(app_home):
    store = Store()
    losses = [2.5, 2.25, 1.75, 1.5]
    insert_finished_run(store, "run-a", "alpha run", losses, eval_losses={2: 2.1, 4: 1.9})
    insert_finished_run(store, "run-b", "beta run", [9.0, 8.0])
    at = open_page("pages/run.py", detail_run_id="run-a")
    assert at.get("vega_lite_chart"), "no charts drawn"
    frames = chart_frames(at)
    loss = next(f for f in frames if "train loss" in set(f["series"]))
    assert loss[loss["series"] == "train loss"]["value"].tolist() == losses
    assert loss[loss["series"] == "eval loss"]["value"].tolist() == [2.1, 1.9]
    assert 9.0 not in loss["value"].tolist()  # the other run's data stays out
    assert any("Grad norm" in set(f["series"]) for f in frames)
    assert any(":green-badge[✅ Completed]" in m for m in texts(at, "markdown"))
    assert "/tmp/outputs/run-a" in " ".join(texts(at, "success"))
    assert all("hf_token" not in c.value for c in at.code)


def test_run_page_shows_error_of_a_failed_run(app_home):
    insert_finished_run(Store(), "run-f", "broken run", [3.0, float("nan")], status=RunStatus.FAILED,
                        error="RuntimeError: CUDA out of memory", log_tail="line 1\nline 2")
    at = open_page("pages/run.py", detail_run_id="run-f")
    assert any("CUDA out of memory" in e for e in texts(at, "error"))


def test_live_page_shows_the_most_recent_run_without_a_session_choice(app_home):
    insert_finished_run(Store(), "run-a", "alpha run", [2.0, 1.5, 1.2])
    at = open_page("pages/live.py")
    assert any("alpha run" in m for m in texts(at, "markdown"))
    assert at.get("vega_lite_chart")


def test_pages_without_runs_say_so(app_home):
    for page in ("pages/live.py", "pages/history.py", "pages/run.py"):
        at = open_page(page)
        assert any("No runs yet" in i for i in texts(at, "info")), page


# ---------------------------------------------------------------------- live rendering (plain function)
def _render_live(snapshot):
    from ui.views import render_live

    render_live(snapshot)


def test_render_live_shows_status_progress_and_metrics():
    metrics = pd.DataFrame([
        {"step": 1, "loss": 2.0, "learning_rate": 1e-4, "grad_norm": 0.9, "memory_mb": 900.0, "nonfinite": ""},
        {"step": 2, "loss": 1.5, "learning_rate": 2e-4, "grad_norm": 0.8, "memory_mb": 1200.0, "nonfinite": ""},
        {"step": 3, "loss": 1.25, "eval_loss": 1.4, "learning_rate": 1e-4, "grad_norm": 0.7, "memory_mb": 1100.0,
         "nonfinite": ""},
    ], columns=METRIC_COLUMNS)
    snapshot = LiveSnapshot(run_id="r1", name="demo run", status=RunStatus.RUNNING, phase="training", engine="hf",
                            step=3, total_steps=12, epoch=0.25, loss=1.25, eval_loss=1.4, learning_rate=1e-4,
                            grad_norm=0.7, tokens_seen=12345, tokens_per_s=321.5, memory_mb=1100.0,
                            started_at=time.time() - 65, eta_s=3725, warnings=("tokenizer has no pad token",),
                            metrics=metrics)
    at = AppTest.from_function(_render_live, args=(snapshot,), default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    assert any(":blue-badge[🏃 Training] training" in m for m in texts(at, "markdown"))
    assert at.get("progress")[0].proto.value == 25
    assert at.get("progress")[0].proto.text == "step 3 / 12"
    tiles = {m.label: m.value for m in at.metric}
    assert tiles["Loss"] == "1.25"
    assert tiles["Learning rate"] == "1.0e-04"
    assert tiles["Grad norm"] == "0.7"
    assert tiles["Tokens seen"] == "12.3k"
    assert tiles["Peak memory"] == "1.17 GB"
    assert tiles["ETA"] == "1h 02m 05s"
    assert texts(at, "warning") == ["tokenizer has no pad token"]
    assert not at.error and not at.success
    frames = chart_frames(at)
    loss = next(f for f in frames if "train loss" in set(f["series"]))
    assert loss[loss["series"] == "train loss"]["value"].tolist() == [2.0, 1.5, 1.25]
    assert loss[loss["series"] == "eval loss"]["value"].tolist() == [1.4]


def test_render_live_shows_error_and_log_of_a_failed_run():
    metrics = pd.DataFrame([{"step": 1, "loss": 2.0, "nonfinite": ""}, {"step": 2, "loss": None, "nonfinite": "loss"}],
                           columns=METRIC_COLUMNS)
    snapshot = LiveSnapshot(run_id="r2", name="bad run", status=RunStatus.FAILED, step=2, total_steps=10,
                            error="loss became NaN", log_tail="Traceback...\nValueError", metrics=metrics)
    at = AppTest.from_function(_render_live, args=(snapshot,), default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    assert any("loss became NaN" in e for e in texts(at, "error"))
    assert any("Traceback" in c.value for c in at.code)
    assert any("Non-finite values (loss) first at step 2" in w for w in texts(at, "warning"))
    assert {m.label: m.value for m in at.metric}["ETA"] == "—"


def test_render_live_shows_the_output_folder_when_done():
    snapshot = LiveSnapshot(run_id="r3", name="done", status=RunStatus.COMPLETED, step=5, total_steps=5,
                            output_dir="/data/runs/r3/adapter")
    at = AppTest.from_function(_render_live, args=(snapshot,), default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    assert "/data/runs/r3/adapter" in at.success[0].value
    assert any("No metrics logged yet" in c.value for c in at.caption)


def test_render_live_without_a_run():
    at = AppTest.from_function(_render_live, args=(None,), default_timeout=TIMEOUT).run()
    assert "No runs yet" in at.info[0].value


# ---------------------------------------------------------------------- formatting
@pytest.mark.parametrize("seconds, text", [(None, "—"), (0, "0s"), (45.4, "45s"), (123, "2m 03s"),
                                           (3723, "1h 02m 03s"), (float("nan"), "—"), (-1, "—")])
def test_duration(seconds, text):
    assert fmt.duration(seconds) == text


def test_number_formats():
    assert fmt.number(None) == "—" and fmt.number(float("inf")) == "—"
    assert fmt.number(1234567) == "1,234,567"
    assert fmt.number(0.123456) == "0.1235"
    assert fmt.scientific(2e-4) == "2.00e-04"
    assert fmt.compact(1_500_000) == "1.5M"
    assert fmt.memory(512) == "512 MB" and fmt.memory(2048) == "2.00 GB"
    assert fmt.steps(3, 10) == "3 / 10" and fmt.steps(None, 10) == "—"
    assert fmt.status_badge("stopped") == "💾 Stopped (saved)"
    assert fmt.timestamp(None) == "—"


# ---------------------------------------------------------------------- Start -> Live (spawns a real worker)
@pytest.mark.train
def test_start_reaches_the_live_view_and_cancel_ends_the_run(app_home, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_MODELS", str(MODELS_CACHE))  # convert once per machine
    at = open_page("pages/new_run.py")
    at.text_input(key="nr_run_name").input("page start test")
    at.number_input(key="nr_max_steps").set_value(2)
    submit(at)
    run_id = at.session_state["live_run_id"]
    orch = get_orchestrator()
    try:
        assert [t.value for t in at.title] == ["Live"]
        assert any("page start test" in m for m in texts(at, "markdown"))
        at.switch_page("pages/live.py").run()  # AppTest reruns the page it was told about, so follow the switch
        assert not at.exception, at.exception
        cancel = [b for b in at.button if b.label == "Cancel"]
        if cancel:  # the worker may already have ended (e.g. failed fast); then there is nothing to press
            cancel[0].click().run()
            assert not at.exception, at.exception
            assert any(e.kind == "control" and "cancel" in e.message for e in orch.events(run_id))
    finally:
        orch.cancel(run_id)
        final = orch.wait(run_id, timeout=180)
    assert final.status.is_terminal()
    assert Store().get_run(run_id).name == "page start test"


def test_run_page_follows_the_run_chosen_in_its_selectbox(app_home):
    store = Store()
    insert_finished_run(store, "run-a", "alpha run", [2.0, 1.0])
    insert_finished_run(store, "run-b", "beta run", [7.0, 6.0])
    at = open_page("pages/run.py", detail_run_id="run-a")
    assert any("### alpha run" == m for m in texts(at, "markdown"))
    at.selectbox(key="run_pick").set_value("run-b").run()
    assert not at.exception, at.exception
    assert any("### beta run" == m for m in texts(at, "markdown"))
    assert at.session_state["detail_run_id"] == "run-b" and at.query_params["run"] == "run-b"
    loss = next(f for f in chart_frames(at) if "train loss" in set(f["series"]))
    assert loss[loss["series"] == "train loss"]["value"].tolist() == [7.0, 6.0]


def test_ago_is_coarse_enough_for_a_tile():
    assert fmt.ago(1000.0, now=1010.0) == "just now"
    assert fmt.ago(1000.0, now=1000.0 + 5 * 60 + 7) == "5m ago"
    assert fmt.ago(1000.0, now=1000.0 + 3 * 3600 + 120) == "3h ago"
    assert fmt.ago(1000.0, now=1000.0 + 2 * 86400 + 7200) == "2d ago"
    assert fmt.ago(None) == fmt.MISSING
