"""The Playground page through AppTest, with the model server faked at the HTTP level (tests/support/fake_openai.py),
and the logic of ui/playground.py on its own."""
from __future__ import annotations

import json
import sys
import threading
import time

import pandas as pd
import pytest
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
from streamlit.testing.v1 import AppTest

from db import users
from db.entities import RunRecord
from db.store import Store
from tests.support import MODELS_CACHE
from tests.support.apptest import open_page, texts
from tests.support.factories import finished_run
from tests.support.fake_openai import FAKE_JOB_ID, FakeOpenAI, FakeServeJob
from tests.test_text_safety import PAYLOADS, assert_nothing_interpreted
from trainer_core.config import promptsets
from trainer_core.auth.access import Role
from trainer_core.config import BUNDLED_MODEL
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol.status import JobKind, RunStatus
from trainer_core.serving.client import Sampling
from ui import auth
from ui import playground as pg
from ui.state import get_orchestrator
from ui.text import safe

PAGE = "pages/playground.py"

BASE_KEY = ModelSource(model=BUNDLED_MODEL).key
TUNED_ID = "20260101-120000-aaaaaa"
TUNED_KEY = f"run:{TUNED_ID}"
# Model output is untrusted: markdown, HTML and a link must come out as the text they are.
BASE_ANSWER = "Base says *hello* <b>bold</b> [x](http://evil.example)"
TUNED_ANSWER = "Tuned answer: {last} done"


@pytest.fixture
def fake_server():
    server = FakeOpenAI({"smollm2": BASE_ANSWER, "tuned": TUNED_ANSWER, "tuned-step5": "step five says {last}"}).start()
    yield server
    server.stop()


@pytest.fixture
def serve_job(app_home, fake_server, monkeypatch) -> FakeServeJob:
    job = FakeServeJob(fake_server.url, fake_server.api_key,
                       {BASE_KEY: "smollm2", TUNED_KEY: "tuned", f"{TUNED_KEY}@5": "tuned-step5"})
    job.install(lambda target, name, value: monkeypatch.setattr(target, name, value, raising=False))
    return job


@pytest.fixture
def runs(app_home):
    store = Store()
    finished_run(store, TUNED_ID, "tuned run", steps=(5, 10))
    finished_run(store, "20260101-110000-bbbbbb", "no adapter run", final=False)
    finished_run(store, "20260101-100000-cccccc", "failed run", status=RunStatus.FAILED)
    store.engine.dispose()


def pick(at: AppTest, column: int, kind: str, run: str | None = None, step: int | None = None) -> None:
    at.selectbox(key=f"pg_kind_{column}").set_value(kind).run()
    if run is not None:
        at.selectbox(key=f"pg_run_{column}").set_value(run).run()
        at.selectbox(key=f"pg_step_{column}").set_value(step).run()
    assert not at.exception, at.exception


def load(at: AppTest) -> AppTest:
    next(b for b in at.button if b.label == "Load models").click().run()
    assert not at.exception, at.exception
    return at


def base_and_tuned(at: AppTest) -> AppTest:
    pick(at, 0, "base")
    pick(at, 1, "run", TUNED_ID, None)
    return load(at)


def ask(at: AppTest, text: str) -> AppTest:
    at.chat_input(key="pg_input").set_value(text).run()
    assert not at.exception, at.exception
    return at


# ====================================================================== sources
def test_sources_offer_finished_runs_with_their_checkpoints(serve_job, runs):
    at = open_page(PAGE, timeout=60)
    at.selectbox(key="pg_kind_1").set_value("run").run()
    offered = at.selectbox(key="pg_run_1").options
    assert any("tuned run" in o for o in offered) and any("no adapter run" in o for o in offered)
    assert not any("failed run" in o for o in offered)  # failed runs are not offered
    at.selectbox(key="pg_run_1").set_value(TUNED_ID).run()
    assert at.selectbox(key="pg_step_1").options == ["final model", "checkpoint-10", "checkpoint-5"]
    assert texts(at, "error") == []


def test_a_run_without_an_adapter_shows_why_and_loads_nothing(serve_job, runs):
    at = open_page(PAGE, timeout=60)
    pick(at, 0, "base")
    pick(at, 1, "run", "20260101-110000-bbbbbb", None)
    errors = texts(at, "error")
    assert len(errors) == 1 and "Column 2: run 'no adapter run' has no saved adapter yet" in errors[0].replace("\\", "")
    assert next(b for b in at.button if b.label == "Load models").disabled
    assert serve_job.started == []


def test_the_same_model_twice_is_refused(serve_job, runs):
    at = open_page(PAGE, timeout=60)
    pick(at, 0, "base")
    pick(at, 1, "base")
    assert any("Column 2 shows the same model as column 1" in e for e in texts(at, "error"))


def test_queued_loading_and_failed_servers_are_shown(serve_job, runs):
    serve_job.start_status = RunStatus.QUEUED
    at = base_and_tuned(open_page(PAGE, timeout=60))
    assert any(i.startswith("Queued") for i in texts(at, "info")), texts(at, "info")
    assert not at.chat_input  # no chat before the server is ready
    serve_job.status, serve_job.ready = RunStatus.RUNNING, False
    at.run()
    assert any(i.startswith("Loading the models") for i in texts(at, "info")), texts(at, "info")
    serve_job.status, serve_job.error = RunStatus.FAILED, "out of memory"
    serve_job.log_tail = "Traceback...\nMemoryError"
    at.run()
    assert any("The model server failed: out of memory (its log ends below)" in e for e in texts(at, "error"))
    assert "MemoryError" in at.code[0].value
    assert serve_job.started == [[BASE_KEY, TUNED_KEY]]


def test_a_second_tab_reuses_the_running_server(serve_job, runs):
    base_and_tuned(open_page(PAGE, timeout=60))
    other = base_and_tuned(open_page(PAGE, timeout=60))  # another browser tab, the same models
    assert serve_job.started == [[BASE_KEY, TUNED_KEY]]
    assert other.chat_input(key="pg_input")
    serve_job.status = RunStatus.COMPLETED  # stopped (idle timeout): the next Load starts a new one
    other.run()
    assert any("has completed" in e and "press Load" in e for e in texts(other, "error"))
    load(other)
    assert len(serve_job.started) == 2


def test_loading_other_models_stops_the_previous_server(serve_job, runs):
    at = base_and_tuned(open_page(PAGE, timeout=60))
    pick(at, 1, "run", TUNED_ID, 5)
    assert any("not the ones loaded" in i for i in texts(at, "info"))
    load(at)
    assert serve_job.stops == 1  # else the new server would wait behind the old one for the device
    assert serve_job.started == [[BASE_KEY, TUNED_KEY], [BASE_KEY, f"{TUNED_KEY}@5"]]
    ask(at, "q")
    assert safe("step five says q") in texts(at, "markdown")


def test_a_viewer_cannot_load_models(serve_job, runs, monkeypatch):
    users.ensure_user(get_orchestrator().store, "val", Role.VIEWER)
    monkeypatch.setenv(auth.SHARED_ENV, "1")
    monkeypatch.setattr(auth, "proxy_user", lambda: "val")
    monkeypatch.setattr(auth, "proxy_session", lambda: users.get_user(get_orchestrator().store, "val").session_generation)
    at = open_page(PAGE, timeout=60)
    button = next(b for b in at.button if b.label == "Load models")
    assert button.disabled and "you are viewer" in button.help
    assert any(i.startswith("Viewers cannot load models") for i in texts(at, "info"))
    assert serve_job.started == []


# ====================================================================== chat
def test_answers_stream_into_every_column_with_stats(serve_job, runs, fake_server):
    at = base_and_tuned(open_page(PAGE, timeout=60))
    at.text_area(key="pg_system").input("Be brief.")
    at.number_input(key="pg_temperature").set_value(0.0)
    ask(at, "What is 2+2?")
    markdown = texts(at, "markdown")
    assert safe(BASE_ANSWER) in markdown  # escaped: no bold, no HTML, no link
    assert safe("Tuned answer: What is 2+2? done") in markdown
    stats = [c for c in texts(at, "caption") if " tokens · first token " in c]
    assert len(stats) == 2 and all("tokens/s" in c for c in stats), stats
    sent = {r["model"]: r for r in fake_server.chat_requests()}
    assert sent["smollm2"]["messages"] == [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "What is 2+2?"}]
    assert sent["tuned"]["temperature"] == 0.0 and sent["tuned"]["stream"] is True

    ask(at, "And 3+3?")  # multi-turn: each model sees its own earlier answer
    second = [r for r in fake_server.chat_requests() if r["messages"][-1]["content"] == "And 3+3?"]
    tuned = next(r for r in second if r["model"] == "tuned")
    assert tuned["messages"][1:] == [{"role": "user", "content": "What is 2+2?"},
                                     {"role": "assistant", "content": "Tuned answer: What is 2+2? done"},
                                     {"role": "user", "content": "And 3+3?"}]


def test_sampling_errors_name_the_field_and_block_the_chat(serve_job, runs):
    at = base_and_tuned(open_page(PAGE, timeout=60))
    at.number_input(key="pg_temperature").set_value(5.0)
    at.number_input(key="pg_max_new").set_value(0).run()
    errors = texts(at, "error")
    assert any(e.startswith("**temperature**:") and "at most 2" in e for e in errors), errors
    assert any(e.startswith("**max_new_tokens**:") for e in errors), errors
    assert at.chat_input(key="pg_input").disabled


def test_hostile_run_names_and_answers_are_shown_as_text(app_home, monkeypatch):
    hostile_answers = {"smollm2": PAYLOADS["image"] + "\n" + PAYLOADS["lines"],
                       "tuned": " ".join([PAYLOADS["emoji"], PAYLOADS["markup"], PAYLOADS["links"]])}
    server = FakeOpenAI(hostile_answers).start()
    try:
        job = FakeServeJob(server.url, server.api_key, {BASE_KEY: "smollm2", TUNED_KEY: "tuned"})
        job.install(lambda target, name, value: monkeypatch.setattr(target, name, value, raising=False))
        store = Store()
        finished_run(store, TUNED_ID, PAYLOADS["html"])
        store.engine.dispose()
        at = base_and_tuned(open_page(PAGE, timeout=60))
        ask(at, PAYLOADS["markup"])
        assert_nothing_interpreted(at, [PAYLOADS["html"] + " · final", PAYLOADS["markup"], *hostile_answers.values()],
                                   "Playground")
    finally:
        server.stop()


def test_a_refused_key_is_a_clear_message(serve_job, runs):
    serve_job.api_key = "sk-wrong"
    at = base_and_tuned(open_page(PAGE, timeout=60))
    ask(at, "hi")
    errors = texts(at, "error")
    assert sum("refused the API key (401)" in e for e in errors) == 2, errors


def test_a_server_dying_mid_answer_keeps_the_other_column(serve_job, runs, fake_server):
    fake_server.die_after = {"tuned": 2}
    at = base_and_tuned(open_page(PAGE, timeout=60))
    ask(at, "Tell me more")
    assert safe(BASE_ANSWER) in texts(at, "markdown")  # the base column answered in full
    assert safe("Tuned answer:") in texts(at, "markdown")  # the two pieces that came before the server died
    warnings = texts(at, "warning")
    assert len(warnings) == 1 and warnings[0].startswith("Interrupted: the model server at") and "mid" in warnings[0]
    lines = [json.loads(line) for line in pg.conversation_jsonl(at.session_state["pg_turns"]).splitlines()]
    assert [(line["source"], line["status"]) for line in lines if line["role"] == "assistant"] == \
        [(BASE_KEY, pg.DONE), (TUNED_KEY, pg.INTERRUPTED)]


@pytest.fixture
def downloads(monkeypatch) -> dict[str, bytes]:
    """What the page offers for download, by file name (captured where Streamlit stores it)."""
    captured: dict[str, bytes] = {}
    real = MemoryMediaFileStorage.load_and_get_id

    def load_and_get_id(self, path_or_data, mimetype, kind, filename=None):
        captured[filename] = path_or_data
        return real(self, path_or_data, mimetype, kind, filename)

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", load_and_get_id)
    return captured


def test_a_server_job_ending_mid_answer_interrupts_every_column(serve_job, runs, fake_server):
    fake_server.gate = threading.Event()  # the answers stop after their first piece and never finish

    def fail_job_once_asked() -> None:
        deadline = time.monotonic() + 60
        while len(fake_server.chat_requests()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        serve_job.status, serve_job.error = RunStatus.FAILED, "killed by SIGKILL"

    at = base_and_tuned(open_page(PAGE, timeout=60))
    threading.Thread(target=fail_job_once_asked, daemon=True).start()
    ask(at, "hello?")  # returns: the page sees the job fail and stops waiting for the stuck server
    turn = at.session_state["pg_turns"][0]
    assert {a.status for a in turn.answers.values()} <= {pg.INTERRUPTED, pg.FAILED}
    assert all("The model server failed: killed by SIGKILL" in a.error for a in turn.answers.values())


def test_conversation_downloads_as_jsonl(serve_job, runs, downloads):
    at = base_and_tuned(open_page(PAGE, timeout=60))
    at.text_area(key="pg_system").input("Be kind.")
    ask(at, "Hi")
    button = next(b for b in at.get("download_button") if b.proto.label == "Download JSONL")
    assert not button.proto.disabled
    lines = [json.loads(line) for line in downloads["conversation.jsonl"].decode().splitlines()]
    assert [line["role"] for line in lines] == ["system", "user", "assistant", "assistant"]
    assert lines[1]["content"] == "Hi" and lines[1]["sampling"]["max_new_tokens"] == 256
    assert lines[2]["content"] == BASE_ANSWER and lines[2]["source"] == BASE_KEY and lines[2]["tokens"] == 5
    assert lines[3]["model"] == "tuned run · final" and lines[3]["finish_reason"] == "stop" and lines[3]["ttft_s"] > 0


def test_a_user_message_goes_into_a_prompt_set(serve_job, runs):
    at = base_and_tuned(open_page(PAGE, timeout=60))
    ask(at, "Keep this question")
    at.selectbox(key="pg_addset_0").set_value("").run()
    at.text_input(key="pg_addnew_0").input("mine").run()
    at.button(key="pg_add_0").click().run()
    assert promptsets.load("mine").prompts == ("Keep this question",)


# ====================================================================== prompt sets
def test_a_prompt_set_gives_a_table_prompt_by_model(serve_job, runs, fake_server):
    promptsets.save("two", ["First?", "Second?"])
    at = base_and_tuned(open_page(PAGE, timeout=60))
    at.selectbox(key="pg_set").set_value("two").run()
    next(b for b in at.button if b.label == "Run the set on every model").click().run()
    assert not at.exception, at.exception
    table = at.session_state["pg_table"]
    assert list(table.columns) == ["Prompt", "Base · Bundled SmolLM2-135M-Instruct", "tuned run · final"]
    assert table["Prompt"].tolist() == ["First?", "Second?"]
    assert table["tuned run · final"].tolist() == ["Tuned answer: First? done", "Tuned answer: Second? done"]
    assert {r["temperature"] for r in fake_server.chat_requests()} == {0.0}  # greedy by default
    assert any(b.proto.label == "Download CSV" for b in at.get("download_button"))


def test_prompt_sets_are_saved_and_deleted_from_the_page(serve_job, runs):
    at = base_and_tuned(open_page(PAGE, timeout=60))
    at.text_input(key="pg_edit_name_").input("my set")
    at.text_area(key="pg_edit_prompts_").input("one\n\ntwo\n").run()
    next(b for b in at.button if b.label == "Save set").click().run()
    assert promptsets.load("my set").prompts == ("one", "two")
    at.selectbox(key="pg_edit_pick").set_value("my set").run()
    next(b for b in at.button if b.label == "Delete set").click().run()
    assert "my set" not in promptsets.names()
    at.text_input(key="pg_edit_name_").input("bad/name")
    at.text_area(key="pg_edit_prompts_").input("x").run()
    next(b for b in at.button if b.label == "Save set").click().run()
    assert any(e.startswith("**name**:") for e in texts(at, "error"))


def test_the_page_process_never_imports_torch(serve_job, runs):
    at = base_and_tuned(open_page(PAGE, timeout=60))
    ask(at, "hi")
    assert "torch" not in sys.modules and "transformers" not in sys.modules


# ====================================================================== ui/playground.py
def test_messages_skip_turns_a_model_did_not_answer():
    turns = [pg.Turn("q1", {"a": pg.Answer("a", "A", "x", pg.DONE), "b": pg.Answer("b", "B", "", pg.FAILED, "down")}),
             pg.Turn("q2", {"a": pg.Answer("a", "A", "y", pg.DONE), "b": pg.Answer("b", "B", "z", pg.DONE)})]
    assert pg.messages_for("sys", turns, "b", "q3") == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "z"}, {"role": "user", "content": "q3"}]
    assert pg.messages_for("  ", turns, "a")[0] == {"role": "user", "content": "q1"}


def test_jsonl_repeats_the_system_prompt_where_it_changed():
    stats = pg.AnswerStats(tokens=3, ttft_s=0.5, total_s=1.0, tokens_per_s=4.0, finish_reason="stop")
    turns = [pg.Turn("q1", {"a": pg.Answer("a", "A", "x", pg.DONE, stats=stats)}, "s1", Sampling(temperature=0.0)),
             pg.Turn("q2", {"a": pg.Answer("a", "A", "", pg.FAILED, "refused")}, "s1", Sampling()),
             pg.Turn("q3", {}, "", Sampling())]
    lines = [json.loads(line) for line in pg.conversation_jsonl(turns).splitlines()]
    assert [(line["role"], line["content"], line["turn"]) for line in lines] == [
        ("system", "s1", 1), ("user", "q1", 1), ("assistant", "x", 1), ("user", "q2", 2), ("assistant", "", 2),
        ("system", "", 3), ("user", "q3", 3)]
    assert lines[2] == {"role": "assistant", "content": "x", "turn": 1, "source": "a", "model": "A", "status": "done",
                        "error": "", "tokens": 3, "ttft_s": 0.5, "total_s": 1.0, "tokens_per_s": 4.0,
                        "finish_reason": "stop"}
    assert lines[1]["sampling"]["temperature"] == 0.0 and lines[4]["error"] == "refused"


def test_check_message_refuses_nul_and_huge_text():
    assert pg.check_message("fine") == []
    assert pg.check_message("a\x00b")[0].field == "message"
    assert "limit is 32,000" in pg.check_message("x" * 40_000, "system prompt")[0].message


def test_cells_mark_incomplete_answers():
    assert pg.cell_text(pg.Answer("k", "L", "hi", pg.DONE)) == "hi"
    assert pg.cell_text(pg.Answer("k", "L", "hal", pg.INTERRUPTED, "server died")) == "hal [interrupted: server died]"
    assert pg.cell_text(pg.Answer("k", "L", "", pg.STOPPED)) == "[stopped]"


def test_labels_are_made_unique():
    cols = [pg.Column("run:a", "same"), pg.Column("run:b", "same"), pg.Column("base:x", "other")]
    assert pg.unique_labels(cols) == {"run:a": "same (run:a)", "run:b": "same (run:b)", "base:x": "other"}


def test_a_batch_stops_on_request_and_marks_the_answers_stopped(fake_server):
    fake_server.gate = threading.Event()
    columns = [pg.Column("a", "A", "smollm2"), pg.Column("b", "B", "tuned")]
    batch = pg.prompt_set_batch(fake_server.url, fake_server.api_key, columns, "", ("p1", "p2"), Sampling())
    deadline = time.monotonic() + 30
    while not all(row["a"].text and row["b"].text for row in batch.answers()[:1]) and time.monotonic() < deadline:
        time.sleep(0.01)  # waits for a condition (the first piece of both answers), not for time to pass
    batch.stop()
    deadline = time.monotonic() + 30
    while not batch.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    answers = batch.answers()
    assert batch.done()
    assert [answers[0]["a"].text, answers[0]["b"].text] == ["Base", "Tuned"]
    assert {a.status for row in answers for a in row.values()} == {pg.STOPPED}


def test_a_dead_server_skips_the_rest_of_a_column(fake_server):
    fake_server.die_after = {"tuned": 0}
    columns = [pg.Column("b", "B", "tuned")]
    batch = pg.prompt_set_batch(fake_server.url, fake_server.api_key, columns, "", ("p1", "p2", "p3"), Sampling())
    deadline = time.monotonic() + 30
    while not batch.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    statuses = [row["b"].status for row in batch.answers()]
    assert statuses == [pg.FAILED, pg.SKIPPED, pg.SKIPPED]
    table = pg.prompt_set_table(("p1", "p2", "p3"), columns, batch.answers())
    assert isinstance(table, pd.DataFrame) and table.iloc[1, 1] == "[not asked: the server failed on an earlier prompt]"
    assert len(fake_server.chat_requests()) == 1


def test_a_stuck_server_times_out_and_a_failing_one_skips_the_rest(fake_server):
    fake_server.gate, fake_server.gate_after = threading.Event(), 0  # never set: headers, then nothing
    stuck = pg.Batch(fake_server.url, fake_server.api_key, [pg.Column("a", "A", "smollm2")],
                     [{"a": [{"role": "user", "content": "hi"}]}], Sampling(), timeout_s=0.5)
    deadline = time.monotonic() + 30
    while not stuck.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    answer = stuck.answers()[0]["a"]
    assert (answer.status, answer.text) == (pg.FAILED, "")
    assert "within 0.5 s: it may be overloaded or stuck" in answer.error, answer.error

    fake_server.gate.set()
    fake_server.fail_status = 500
    failing = pg.prompt_set_batch(fake_server.url, fake_server.api_key, [pg.Column("a", "A", "smollm2")], "",
                                  ("p1", "p2"), Sampling())
    deadline = time.monotonic() + 30
    while not failing.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    first, second = (row["a"] for row in failing.answers())
    assert first.status == pg.FAILED and "failed (500): the fake server was told to fail" in first.error
    assert second.status == pg.SKIPPED


def test_an_unexpected_error_in_a_column_ends_its_answer(fake_server, monkeypatch):
    def broken_stream(*args, **kwargs):
        raise KeyError("choices")

    monkeypatch.setattr(pg, "stream_chat", broken_stream)
    batch = pg.prompt_set_batch(fake_server.url, fake_server.api_key, [pg.Column("a", "A", "smollm2")], "",
                                ("p1", "p2"), Sampling())
    deadline = time.monotonic() + 30
    while not batch.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    first, second = (row["a"] for row in batch.answers())
    assert (first.status, first.error) == (pg.FAILED, "the answer could not be read: KeyError: 'choices'")
    assert (second.status, second.error) == (pg.SKIPPED, "not asked: an earlier answer could not be read")


def test_server_state_for_a_gone_job(app_home):
    state = pg.server_state(get_orchestrator(), FAKE_JOB_ID)
    assert state.phase == pg.ENDED and "press Load" in state.message


class _Jobs:
    """The orchestrator calls server_state makes, answered from a dict of rows."""

    def __init__(self, rows: dict[str, RunRecord], active: str | None = None):
        self.rows, self.active = rows, active

    def get_run(self, run_id: str) -> RunRecord | None:
        return self.rows.get(run_id)

    def active_run_id(self, kind: JobKind | None = JobKind.TRAIN) -> str | None:
        return self.active

    def endpoint(self, job_id: str) -> None:
        return None


def test_server_state_says_what_a_queued_server_waits_for():
    serve = RunRecord(id="s1", kind=JobKind.SERVE, status=RunStatus.QUEUED)
    training = RunRecord(id="t1", name="big run", kind=JobKind.TRAIN, status=RunStatus.RUNNING)
    state = pg.server_state(_Jobs({"s1": serve, "t1": training}, active="t1"), "s1")
    assert state.phase == pg.QUEUED
    assert state.message.startswith("Queued behind 'big run' (training job), which holds the device")
    loading = RunRecord(id="s1", kind=JobKind.SERVE, status=RunStatus.RUNNING, phase="merging adapter")
    assert pg.server_state(_Jobs({"s1": loading}), "s1").message.startswith("Loading the models (merging adapter)")


@pytest.mark.subprocess
def test_show_prompt_renders_the_training_chat_template(serve_job, runs, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_MODELS", str(MODELS_CACHE))  # the converted bundled model
    at = base_and_tuned(open_page(PAGE, timeout=60))
    at.text_area(key="pg_system").input("Be <b>brief</b>.")
    ask(at, "What is 2+2?")
    at.toggle(key="pg_show_prompt").set_value(True).run()
    assert not at.exception, at.exception
    assert texts(at, "error") == []
    shown = [c.value for c in at.code]
    expected = ("<|im_start|>system\nBe <b>brief</b>.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                "<|im_start|>assistant")  # st.code drops the final line break
    assert shown == [expected, expected]  # the base and the run (trained from the bundled model) share the template
    captions = texts(at, "caption")
    assert any(c.startswith("29 tokens · SmolLM2-135M-Instruct (bundled)") for c in captions), captions


@pytest.mark.subprocess
def test_the_page_chats_with_a_real_serve_job(app_home, monkeypatch):
    """No fakes: Load starts a real serve job on the bundled model; the greedy answer comes back through it."""
    monkeypatch.setenv("FINETUNE_STUDIO_MODELS", str(MODELS_CACHE))
    at = load(open_page(PAGE, timeout=60))  # one column: the bundled base model (no runs yet)
    job_id = at.session_state["pg_server"]["job"]
    try:
        deadline = time.monotonic() + 240
        while not at.chat_input and time.monotonic() < deadline:  # the fragment refreshes the job's state
            assert not any("failed" in e for e in texts(at, "error")), texts(at, "error") + [c.value for c in at.code]
            time.sleep(1)
            at.run()
        at.number_input(key="pg_temperature").set_value(0.0)
        at.number_input(key="pg_max_new").set_value(12)
        ask(at, "What is the capital of France?")
        answer = next(iter(at.session_state["pg_turns"][0].answers.values()))
        assert answer.status == pg.DONE and "Paris" in answer.text, answer
        assert answer.stats.tokens > 1 and answer.stats.ttft_s > 0
        assert "torch" not in sys.modules
    finally:
        orch = get_orchestrator()
        orch.stop(job_id)
        orch.wait(job_id, timeout=60)
