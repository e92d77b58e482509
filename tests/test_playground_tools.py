"""The Playground's Tools panel through AppTest, against the fake OpenAI server answering tool_calls
(tests/support/fake_openai.py): tools prefilled from the run's data and sent as ``tools``, calls shown as code with
their arguments, results answered by a mock reply or by the person, multi-step until the model answers, capped;
and the panel's logic (ui/tool_playground.py) on its own."""
from __future__ import annotations

import hashlib
import json

import pytest

from db.store import Store
from tests.support.apptest import open_page, texts
from tests.support.factories import finished_run
from tests.support.fake_openai import FakeOpenAI, FakeServeJob
from trainer_core.config import BUNDLED_MODEL, FieldError, TrainConfig
from trainer_core.serving.client import Sampling, stream_chat
from trainer_core.specs.model_source import ModelSource
from trainer_core.tryout import python_tools
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
    mocked = tp.ToolSetup([WEATHER], {"get_weather": "18C"})
    assert mocked.answers_itself([call])
    assert tp.automatic_step("", [call], mocked) == tp.ToolStep("", [call], ["18C"], [""], ["mock"])
    assert not tp.ToolSetup([WEATHER], {"get_weather": ""}).answers_itself([call])
    steps = [tp.ToolStep("Checking.", [call], ["18C"]), tp.ToolStep("", [call], None)]
    assert tp.step_messages(steps) == [{"role": "assistant", "content": "Checking.", "tool_calls": [call]},
                                       {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "18C"}]
    assert tp.call_text({"function": {"name": "f", "arguments": "{not json"}}) == "f({not json)"
    turn = pg.Turn("Weather?", {"k": pg.Answer("k", "K", text="18C in Lima.", status=pg.DONE, steps=steps[:1])})
    lines = [json.loads(line) for line in pg.conversation_jsonl([turn]).splitlines()]
    assert lines[1]["tool_steps"] == [{"content": "Checking.", "calls": [call], "results": ["18C"]}]
    answered = tp.ToolStep("", [call], ["{}"], [""], ["python /t/w.py:get_weather (sha256 0123456789ab)"])
    turn.answers["k"].steps = [answered]
    assert json.loads(pg.conversation_jsonl([turn]).splitlines()[1])["tool_steps"] == [
        {"content": "", "calls": [call], "results": ["{}"], "errors": [""],
         "replied_by": ["python /t/w.py:get_weather (sha256 0123456789ab)"]}]
    turn.answers["k"].steps = steps[:1]
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


# ---------------------------------------------------------------- Python tool functions
WEATHER_PY = '''
def get_weather(city: str, unit: str = "celsius") -> dict:
    print("a print goes to the child's log, not into its reply")
    return {"city": city, "temp": 18, "unit": unit}
'''
FAULTY_PY = '''
import time


def get_weather(city: str, unit: str = "celsius"):
    raise ValueError(f"no station in {city}")


def calculate(expression: str):
    time.sleep(60)
'''


def tool_file(home, name: str, text: str):
    path = home.parent / "tools" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_a_python_function_answers_the_call_and_the_model_goes_on(serve_job, tool_run, fake_server, app_home):
    path = tool_file(app_home, "weather.py", WEATHER_PY)
    at = loaded_with_tools()
    at.text_input(key="pg_pyfile_get_weather").input(str(path)).run()
    assert not texts(at, "error"), texts(at, "error")
    at.chat_input(key="pg_input").set_value("Weather in Lima?").run()
    assert not at.exception, at.exception
    result = json.dumps({"city": "<b>Lima</b>", "temp": 18, "unit": "celsius"})
    asked = [r for r in fake_server.chat_requests() if r["model"] == "tuned"]
    assert len(asked) == 2  # the call, then the answer after the function's result
    assert asked[1]["messages"][-1] == {"role": "tool", "tool_call_id": "call_fake_0", "name": "get_weather",
                                        "content": result}
    assert result in [c.value for c in at.code]
    assert safe(f"It is {result} in Lima.") in texts(at, "markdown")
    digest = hashlib.sha256(WEATHER_PY.encode()).hexdigest()
    assert "↩️ Result of " + safe(f"python {path}:get_weather (sha256 {digest[:12]})") in texts(at, "caption")
    assert not texts(at, "error")


def test_a_function_that_raises_or_hangs_gives_the_model_an_error_and_the_panel_names_the_tool(
        serve_job, tool_run, fake_server, app_home, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_TOOL_TIMEOUT_S", "1")
    path = tool_file(app_home, "faulty.py", FAULTY_PY)
    fake_server.tool_calls["tuned"] = [CALL, {"name": "calculate", "arguments": {"expression": "2+2"}}]
    at = loaded_with_tools()
    at.text_input(key="pg_pyfile_get_weather").input(str(path)).run()
    at.text_input(key="pg_pyfile_calculate").input(str(path)).run()
    at.chat_input(key="pg_input").set_value("Weather in Lima, and 2+2?").run()
    assert not at.exception, at.exception
    raised = "tool 'get_weather' raised ValueError: no station in <b>Lima</b>"
    hung = ("tool 'calculate' took longer than 1 s: it was ended (raise FINETUNE_STUDIO_TOOL_TIMEOUT_S if it needs "
            "longer)")
    assert texts(at, "error") == [safe(f"{raised} (at {path} line 6)"), safe(hung)]
    sent = [r for r in fake_server.chat_requests() if r["model"] == "tuned"][1]["messages"]
    assert [m["content"] for m in sent[-2:]] == [json.dumps({"error": raised}), json.dumps({"error": hung})]
    assert safe(f"It is {json.dumps({'error': hung})} in Lima.") in texts(at, "markdown")  # the model went on


def test_an_operator_is_refused_python_tools_naming_the_field(serve_job, tool_run, app_home, monkeypatch):
    """On a shared server only an admin runs user code (here the session's person is an operator)."""
    from trainer_core.auth.access import Actor, Role
    from ui import auth

    monkeypatch.setattr(auth, "current_actor", lambda: Actor("ann", Role.OPERATOR))
    path = tool_file(app_home, "weather.py", WEATHER_PY)
    at = loaded_with_tools()
    at.text_input(key="pg_pyfile_get_weather").input(str(path)).run()
    assert texts(at, "error") == [f"**{safe('get_weather: Python file')}**: {safe(python_tools.ADMIN_REASON)}"]
    assert at.chat_input(key="pg_input").disabled


def test_python_tool_files_are_checked_naming_the_field_and_the_fix(home):
    from trainer_core.auth.access import Actor, Role
    from trainer_core.protocol import paths

    admin = Actor("root", Role.ADMIN)
    path = tool_file(home, "weather.py", WEATHER_PY)
    outside = "/etc/hostname.py"
    found, errors = tp.python_setup(admin, {"get_weather": (str(path), ""), "calculate": (str(path), "calc"),
                                            "convert_units": (outside, "")}, {})
    assert list(found) == ["get_weather"] and found["get_weather"].sha256 == hashlib.sha256(
        WEATHER_PY.encode()).hexdigest()
    assert errors[0] == FieldError("calculate: function", "the file defines no top-level function 'calc': name a "
                                                          "function of weather.py (left empty, the tool's name, "
                                                          "calculate, is used)")
    roots = ", ".join(str(root) for root in paths.allowed_data_roots())
    assert errors[1] == FieldError("convert_units: Python file", (
        f"{outside} resolves to {outside}, which is outside the allowed folders ({roots}): a tool file must be "
        "under the allowed roots (FINETUNE_STUDIO_ALLOWED_ROOTS)"))
    assert len(errors) == 2
    assert tp.python_setup(admin, {"get_weather": (str(path), "")}, {"get_weather": "18C"})[1] == [
        FieldError("get_weather: Python file", "the tool has a mock reply too: clear one of them")]
    assert tp.python_setup(Actor("ann", Role.OPERATOR), {"get_weather": (str(path), "")}, {})[1] == [
        FieldError("get_weather: Python file", python_tools.ADMIN_REASON)]
    assert tp.python_setup(admin, {"get_weather": ("", "")}, {}) == ({}, [])


EDGES_PY = '''
import os
import sys


def leave(code: int):
    sys.exit(code)


def vanish():
    os._exit(3)


def shout(text: str):
    print("PRINTED")
    return {"said": text.upper(), "items": [1, 2]}


def odd():
    return {1, 2}
'''


def test_a_round_of_calls_in_one_child_each_fault_its_own_result(home):
    from trainer_core.auth.access import Actor, Role

    path = tool_file(home, "edges.py", EDGES_PY)
    tools = {name: python_tools.load(Actor("root", Role.ADMIN), name, str(path))[0]
             for name in ("leave", "vanish", "shout", "odd")}
    calls = [{"function": {"name": name, "arguments": arguments}} for name, arguments in
             [("leave", '{"code": 2}'), ("vanish", "{}"), ("shout", '{"text": "hi"}'), ("odd", "{}"),
              ("shout", "[1]"), ("shout", '{"nope": 1}')]]
    replies = python_tools.run_calls(tools, calls)
    assert [r.error.split(" (at ")[0] for r in replies] == [
        "tool 'leave' called sys.exit(2): a tool returns its result and never ends the worker",
        "tool 'vanish' called os._exit(3): a tool returns its result and never ends the worker",
        "", "", "tool 'shout' was called with arguments that are not a JSON object: [1]",
        "tool 'shout' raised TypeError: shout() got an unexpected keyword argument 'nope'"]
    assert [r.result for r in replies[2:4]] == ['{"said": "HI", "items": [1, 2]}', "{1, 2}"]
    assert json.loads(replies[0].result) == {"error": "tool 'leave' called sys.exit(2): a tool returns its result "
                                                      "and never ends the worker"}
