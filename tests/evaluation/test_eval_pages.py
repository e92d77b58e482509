"""The Evaluation tab of Run details, History's eval column and Compare's eval table, with results in the store."""
from __future__ import annotations

import json
import time

import pandas as pd

from db.entities import RunRecord
from db.store import Store
from tests.support.factories import insert_finished_run
from tests.support.apptest import open_page, texts
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.jobs import adoption
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus
from tests.speech.test_stt_data import tone
from ui.evaluation import compare_table, headline, metric_rows, playable_clip, worst_first
from ui.text import safe

BASE_KEY = f"base:{BUNDLED_MODEL}"
TRICKY = "<b>bold</b> [click](http://evil.example) **not bold**"


def add_eval(store: Store, job_id: str, source_key: str, source_run_id: str, metrics: dict | None,
             samples: list[dict] = (), status: RunStatus = RunStatus.COMPLETED, created: float = 0.0) -> None:
    store.create_run(RunRecord(id=job_id, name=f"Eval {job_id}", kind=JobKind.EVAL, status=RunStatus.RUNNING,
                               model=source_key, method="Evaluation", created_at=created or time.time()))
    store.save_eval_result(job_id, source_key=source_key, source_run_id=source_run_id, base_model=BUNDLED_MODEL,
                           data_fingerprint="fp", settings_hash="sh", data_label="test.jsonl", metrics=metrics,
                           created_at=created or time.time())
    for row in samples:
        store.save_eval_sample(job_id, row["index"], **{k: v for k, v in row.items() if k != "index"})
    if status.is_terminal():
        store.finish_run(job_id, status)


def samples_table(at) -> pd.DataFrame:
    return next(d.value for d in at.dataframe if "answer" in d.value.columns)


SAMPLES = [
    {"index": 0, "prompt": "Capital of France?", "reference": "Paris.", "answer": "Paris.", "exact": 1.0,
     "rouge_l": 1.0, "bleu": 100.0, "loss": 0.2, "tokens": 3},
    {"index": 1, "prompt": "Say hi", "reference": "Hello!", "answer": TRICKY, "exact": 0.0, "rouge_l": 0.0,
     "bleu": 0.0, "loss": 3.0, "tokens": 2},
    {"index": 2, "prompt": "2+2?", "reference": "It is 4.", "answer": "It is four.", "exact": 0.0, "rouge_l": 0.5,
     "bleu": 20.0, "loss": 1.0, "tokens": 4},
]


def test_the_evaluation_tab_shows_metrics_against_the_baseline_and_samples_worst_first(app_home):
    store = Store()
    insert_finished_run(store, "run-a", "alpha run", [2.0, 1.0])
    add_eval(store, "eval-base", BASE_KEY, "", {"samples": 3, "exact": 0.0, "rouge_l": 0.25, "loss": 2.0},
             created=time.time() - 100)
    add_eval(store, "eval-a", "run:run-a", "run-a", {"samples": 3, "exact": 1 / 3, "rouge_l": 0.5, "loss": 1.4},
             SAMPLES)
    at = open_page("pages/run.py", detail_run_id="run-a")
    metrics = {m.label: (m.value, m.proto.delta) for m in at.metric if m.label in ("Exact match", "ROUGE-L", "Loss")}
    assert metrics == {"Exact match": ("0.3333", "+0.3333"), "ROUGE-L": ("0.5", "+0.2500"),
                       "Loss": ("1.4", "-0.6000")}
    assert any("Deltas against the base model" in c for c in texts(at, "caption"))
    table = samples_table(at)
    assert table["index"].tolist() == [1, 2, 0]  # ROUGE-L, worst first
    assert table.loc[table["index"] == 1, "answer"].item() == TRICKY  # a dataframe cell is plain text
    at.selectbox(key="evaltab_sort_done").set_value("loss").run()
    assert samples_table(at)["index"].tolist() == [1, 2, 0]  # highest loss first
    markdown = texts(at, "markdown")
    assert any(safe(TRICKY, 4000) in m for m in markdown) and not any(TRICKY in m for m in markdown)


def test_an_eval_job_page_and_a_running_eval(app_home):
    store = Store()
    insert_finished_run(store, "run-a", "alpha run", [2.0, 1.0])
    add_eval(store, "eval-live", "run:run-a", "run-a", None, status=RunStatus.RUNNING)
    store.update_run("eval-live", steps_done=1, total_steps=3, phase="generating")
    folder = paths.run_dir("eval-live")
    folder.mkdir(parents=True)
    (folder / "predictions.jsonl").write_text(json.dumps({**SAMPLES[1], "judge": None}) + "\n" + '{"index": 1, "pro')
    lock = adoption.try_lock(folder)  # "another process pumps it": the page's orchestrator leaves it alone
    try:
        at = open_page("pages/run.py", detail_run_id="eval-live")
    finally:
        lock.close()
    assert any("1 of 3 samples" in p.proto.text for p in at.get("progress"))
    live = samples_table(at)  # read from predictions.jsonl; the half-written last line is not shown
    assert live["answer"].tolist() == [TRICKY] and "1 prediction(s) so far" in texts(at, "caption")
    add_eval(store, "eval-failed", "run:run-a", "run-a", None, status=RunStatus.RUNNING)
    store.finish_run("eval-failed", RunStatus.FAILED, error="ValueError: the judge <endpoint>")
    at = open_page("pages/run.py", detail_run_id="eval-failed")
    assert texts(at, "error") == [safe("ValueError: the judge <endpoint>")]  # once, escaped
    at = open_page("pages/run.py", detail_run_id="run-a")  # from the run's tab: the eval's error is shown there
    at.selectbox(key="evaltab_pick").set_value("eval-failed").run()
    assert texts(at, "error") == [safe("ValueError: the judge <endpoint>")]


def test_history_and_compare_show_the_latest_completed_eval(app_home):
    store = Store()
    insert_finished_run(store, "run-a", "alpha run", [2.0, 1.0])
    insert_finished_run(store, "run-b", "beta run", [3.0, 2.0])
    add_eval(store, "eval-old", "run:run-a", "run-a", {"samples": 3, "rouge_l": 0.1}, created=time.time() - 100)
    add_eval(store, "eval-new", "run:run-a", "run-a", {"samples": 3, "rouge_l": 0.75})
    add_eval(store, "eval-stopped", "run:run-b", "run-b", {"samples": 1, "rouge_l": 0.9, "partial": True},
             status=RunStatus.RUNNING)
    store.finish_run("eval-stopped", RunStatus.STOPPED)
    at = open_page("pages/history.py")
    table = at.dataframe[0].value
    shown = dict(zip(table["name"], table["eval"]))
    assert shown["alpha run"] == "ROUGE-L 0.750" and shown["beta run"] == ""  # a stopped eval is partial: not shown
    latest = store.latest_eval_metrics(["run-a", "run-b"])
    runs = store.get_runs(["run-a", "run-b"])
    assert compare_table(runs, latest)[["run", "ROUGE-L"]].values.tolist()[0] == ["alpha run", 0.75]
    assert pd.isna(compare_table(runs, latest)["ROUGE-L"].tolist()[1])


def test_pure_helpers():
    rows = metric_rows({"exact": 0.5, "loss": 1.0, "perplexity": None}, {"exact": 0.25, "loss": 2.0})
    assert [(r["key"], r["delta"]) for r in rows] == [("exact", 0.25), ("loss", -1.0), ("perplexity", None)]
    frame = pd.DataFrame({"index": [0, 1, 2], "judge": [5.0, None, 2.0]})
    assert worst_first(frame, "judge")["index"].tolist() == [2, 0, 1]  # unscored last
    assert headline({"exact": 1.0}) == "Exact match 1.000" and headline(None) == ""


def test_the_start_form_lists_every_problem_and_submits_nothing(app_home, tmp_path):
    store = Store()
    insert_finished_run(store, "run-a", "alpha run", [2.0, 1.0])
    adapter = paths.run_dir("run-a") / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    (adapter.parent / "config.yaml").write_text(TrainConfig(model_name=BUNDLED_MODEL, run_name="alpha run").to_yaml())
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    at = open_page("pages/run.py", detail_run_id="run-a")
    at.radio(key="evaltab_data_kind").set_value("path").run()
    at.text_input(key="evaltab_path").set_value(str(empty))
    at.multiselect(key="evaltab_metrics").set_value(["exact", "judge"])
    at.button(key="evaltab_start").click().run()
    assert texts(at, "error") == ["  \n".join([
        "**judge_url**: the judge needs the base URL of an OpenAI-compatible endpoint, e.g. https\\://api.openai.com/v1 "
        "(or drop 'judge' from metrics)", "**judge_model**: name the model the judge endpoint should use",
        "**data**: empty.jsonl has no rows"])]
    assert [r.id for r in store.list_runs()] == ["run-a"]  # nothing queued


def test_with_a_cluster_the_form_offers_it_and_the_job_carries_launcher_ray(app_home, tmp_path, monkeypatch):
    store = Store()
    insert_finished_run(store, "run-a", "alpha run", [2.0, 1.0])
    adapter = paths.run_dir("run-a") / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    (adapter.parent / "config.yaml").write_text(TrainConfig(model_name=BUNDLED_MODEL, run_name="alpha run").to_yaml())
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps({"instruction": "Say hi", "output": "Hello!"}) + "\n")
    at = open_page("pages/run.py", detail_run_id="run-a")
    assert not [r for r in at.radio if r.key == "evaltab_launcher"]  # no cluster: nothing to choose
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    monkeypatch.delenv("FINETUNE_STUDIO_SHARED_STORAGE", raising=False)
    at = open_page("pages/run.py", detail_run_id="run-a")
    assert at.radio(key="evaltab_launcher").options == ["This host", "The Ray cluster"]
    at.radio(key="evaltab_launcher").set_value("ray").run()
    at.radio(key="evaltab_data_kind").set_value("path").run()
    at.text_input(key="evaltab_path").set_value(str(data))
    at.multiselect(key="evaltab_metrics").set_value(["exact"])
    at.button(key="evaltab_start").click().run()
    # the spec went to the cluster's checks: the run folders are not on storage the nodes share
    assert any("**launcher**: launcher: ray: run folders must be on storage every node of the Ray cluster mounts"
               in t for t in texts(at, "error")), texts(at, "error")
    assert [r.id for r in store.list_runs()] == ["run-a"]  # nothing queued


def test_an_eval_clip_player_gets_decoded_audio_only_from_where_user_data_lives(home, tmp_path):
    """Before, the picked clip's player was handed the path predictions.jsonl names (written by a worker, which runs
    user code) when it lay anywhere under the allowed roots, and /media served the file: another run's clip, say."""
    ours = tone(tmp_path / "clips" / "a.wav", 0.5)
    theirs = tone(home / "runs" / "other-run" / "private.wav", 0.5)
    wav = playable_clip(str(ours))
    assert isinstance(wav, bytes) and wav.startswith(b"RIFF")  # the decoded clip, not a path
    assert playable_clip(str(theirs)) is None
    (tmp_path / "clips" / "notes.wav").write_text("not audio")
    assert playable_clip(str(tmp_path / "clips" / "notes.wav")) is None
