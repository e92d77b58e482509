"""The Playground's Tools panel through AppTest, against the fake OpenAI server answering tool_calls
(tests/support/fake_openai.py): tools prefilled from the run's data and sent as ``tools``, calls shown as code with
their arguments, results answered by a mock reply or by the person, multi-step until the model answers, capped;
and the panel's logic (ui/tool_playground.py) on its own."""
from __future__ import annotations

import json

import pytest

from db.store import Store
from tests.support.apptest import open_page, texts
from tests.support.factories import finished_run
from tests.support.fake_openai import FakeOpenAI, FakeServeJob
from trainer_core.config import BUNDLED_MODEL, FieldError, TrainConfig
from trainer_core.serving.client import Sampling, stream_chat
from trainer_core.specs.model_source import ModelSource
from ui import playground as pg
from ui import tool_playground as tp
from ui.text import safe

PAGE = "pages/playground.py"
BASE_KEY = ModelSource(model=BUNDLED_MODEL).key
TUNED_ID = "20260101-120000-aaaaaa"
TUNED_KEY = f"run:{TUNED_ID}"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"},
                                                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                                                "required": ["city"]}}}
CALL = {"name": "get_weather", "arguments": {"city": "<b>Lima</b>"}}  # model output: shown as text, never HTML


@pytest.fixture
def fake_server():
    server = FakeOpenAI({"smollm2": "I cannot check the weather.", "tuned": "It is {tool} in Lima."}).start()
    server.tool_calls["tuned"] = [CALL]
    yield server
    server.stop()


@pytest.fixture
def serve_job(app_home, fake_server, monkeypatch) -> FakeServeJob:
    job = FakeServeJob(fake_server.url, fake_server.api_key, {BASE_KEY: "smollm2", TUNED_KEY: "tuned"})
    job.install(lambda target, name, value: monkeypatch.setattr(target, name, value, raising=False))
    return job


@pytest.fixture
def tool_run(app_home):
    """A finished run trained on the bundled tool-call conversations (the tools the panel is prefilled with)."""
    store = Store()
    folder = finished_run(store, TUNED_ID, "tool run")
    store.engine.dispose()
    cfg = TrainConfig(run_name="tool run", local_datasets=["bundled:demo-tools"], local_eval_datasets=[])
    (folder / "config.yaml").write_text(cfg.to_yaml())


def loaded_with_tools(mock: str = ""):
    at = open_page(PAGE, timeout=60)
    at.selectbox(key="pg_kind_0").set_value("base").run()
    at.selectbox(key="pg_kind_1").set_value("run").run()
    at.selectbox(key="pg_run_1").set_value(TUNED_ID).run()
    next(b for b in at.button if b.label == "Load models").click().run()
    at.toggle(key="pg_tools_on").set_value(True).run()
    if mock:
        at.text_input(key="pg_mock_get_weather").input(mock).run()
    assert not at.exception, at.exception
    return at


def test_the_panel_is_prefilled_from_the_runs_data_and_a_mock_reply_answers_the_call(serve_job, tool_run,
                                                                                   fake_server):
    at = loaded_with_tools(mock='{"temp": 18}')
    offered = json.loads(at.text_area(key="pg_tools_text").value)
    assert [t["function"]["name"] for t in offered] == ["get_weather", "calculate", "convert_units"]
    at.chat_input(key="pg_input").set_value("Weather in Lima?").run()
    assert not at.exception, at.exception

    sent = fake_server.chat_requests()
    assert [r["model"] for r in sent].count("tuned") == 2  # the call, then the answer after the mock reply
    assert all(r["tools"] == offered for r in sent)
    again = [r for r in sent if r["model"] == "tuned"][1]["messages"]
    assert again[-2:] == [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_fake_0", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps(CALL["arguments"])}}]},
        {"role": "tool", "tool_call_id": "call_fake_0", "name": "get_weather", "content": '{"temp": 18}'}]
    codes = [c.value for c in at.code]
    assert 'get_weather({\n  "city": "<b>Lima</b>"\n})' in codes and '{"temp": 18}' in codes
    assert safe('It is {"temp": 18} in Lima.') in texts(at, "markdown")
    assert safe("I cannot check the weather.") in texts(at, "markdown")  # the base model answered in words
    assert not any("<b>" in m for m in texts(at, "markdown"))  # the call's arguments only as code, never markup


def test_the_person_answers_a_call_and_the_model_goes_on(serve_job, tool_run, fake_server):
    at = loaded_with_tools()
    at.chat_input(key="pg_input").set_value("Weather in Lima?").run()
    assert "Waiting for the tool results." in texts(at, "caption")
    send = next(b for b in at.button if b.label == "Send results")
    send.click().run()
    assert any("call 1 has no result" in e for e in texts(at, "error"))
    at.text_area(key=f"pg_result_{TUNED_KEY}_1_1").input("sunny, 21C").run()
    next(b for b in at.button if b.label == "Send results").click().run()
    assert not at.exception, at.exception
    assert safe("It is sunny, 21C in Lima.") in texts(at, "markdown")
    assert not any(b.label == "Send results" for b in at.button)
    assert fake_server.chat_requests()[-1]["messages"][-1] == {
        "role": "tool", "tool_call_id": "call_fake_0", "name": "get_weather", "content": "sunny, 21C"}


def test_a_model_that_keeps_calling_is_stopped_at_the_cap(serve_job, tool_run, fake_server):
    fake_server.answers["tuned"] = "unused"
    fake_server.tool_calls["tuned"] = [CALL]
    original = fake_server.calls_for
    fake_server.calls_for = lambda model, body: [CALL] if model == "tuned" and body.get("tools") else original(model,
                                                                                                             body)
    at = loaded_with_tools(mock="rain")
    at.chat_input(key="pg_input").set_value("Weather?").run()
    assert [r["model"] for r in fake_server.chat_requests()].count("tuned") == tp.MAX_TOOL_STEPS
    assert safe(f"Stopped: the model called tools {tp.MAX_TOOL_STEPS} times in a row: the Playground stopped "
                "asking") in texts(at, "caption")


def test_bad_tool_schemas_name_the_field_and_block_the_chat(serve_job, tool_run):
    at = loaded_with_tools()
    at.text_area(key="pg_tools_text").input('[{"name": "f", "parameters": {"type": "objekt"}}]').run()
    errors = texts(at, "error")
    assert any(e.startswith("**tools**:") and "'f'.parameters is not valid JSON Schema" in e for e in errors), errors
    assert at.chat_input(key="pg_input").disabled


def test_parse_tools_and_the_steps_as_messages():
    assert tp.parse_tools("") == ([], [])
    tools, errors = tp.parse_tools(json.dumps([WEATHER["function"]]))  # a bare function is read as a tool
    assert tools == [WEATHER] and errors == []
    assert tp.parse_tools("[1]")[1] == [FieldError("tools", "a tool must be an object like {\"type\": \"function\", "
                                                            "\"function\": {\"name\": ...}}: give a JSON list such as "
                                                            "[{\"type\": \"function\", \"function\": {\"name\": "
                                                            "\"get_weather\", \"parameters\": {\"type\": \"object\", "
                                                            "\"properties\": {\"city\": {\"type\": \"string\"}}}}}]")]
    assert tp.parse_tools(json.dumps([WEATHER, WEATHER]))[1] == [
        FieldError("tools", "two tools are named 'get_weather': give each tool its own name")]
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lima"}'}}
    assert tp.mock_results([call], {"get_weather": "18C"}) == ["18C"]
    assert tp.mock_results([call], {"get_weather": ""}) is None
    steps = [tp.ToolStep("Checking.", [call], ["18C"]), tp.ToolStep("", [call], None)]
    assert tp.step_messages(steps) == [{"role": "assistant", "content": "Checking.", "tool_calls": [call]},
                                       {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "18C"}]
    assert tp.call_text({"function": {"name": "f", "arguments": "{not json"}}) == "f({not json)"
    turn = pg.Turn("Weather?", {"k": pg.Answer("k", "K", text="18C in Lima.", status=pg.DONE, steps=steps[:1])})
    lines = [json.loads(line) for line in pg.conversation_jsonl([turn]).splitlines()]
    assert lines[1]["tool_steps"] == [{"content": "Checking.", "calls": [call], "results": ["18C"]}]
    assert pg.messages_for("", [turn], "k", "Thanks") == [
        {"role": "user", "content": "Weather?"}, *tp.step_messages(steps[:1]),
        {"role": "assistant", "content": "18C in Lima."}, {"role": "user", "content": "Thanks"}]


def test_the_client_puts_streamed_tool_calls_together(fake_server):
    stream = stream_chat(fake_server.url, fake_server.api_key, "tuned", [{"role": "user", "content": "Lima?"}],
                         Sampling(), tools=[WEATHER])
    assert list(stream) == []
    assert stream.stats.finish_reason == "tool_calls"
    assert stream.tool_calls == [{"id": "call_fake_0", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps(CALL["arguments"])}}]
    assert fake_server.chat_requests()[-1]["tools"] == [WEATHER]
