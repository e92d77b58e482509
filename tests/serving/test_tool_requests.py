"""A chat request with tools, as the key gate checks and shapes it (serving/tool_requests.py): OpenAI's tools,
tool_choice and parallel_tool_calls, tool turns paired with their calls, and every bad field a 400 naming it."""
from __future__ import annotations

import json

import pytest

from trainer_core.serving.gate import RequestRefused, carries_tools, tools_shaped

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def chat(**fields) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "Weather in Oslo?"}], **fields}


def refused(body: dict, transformers_engine: bool = True) -> str:
    with pytest.raises(RequestRefused) as caught:
        tools_shaped(body, transformers_engine)
    assert caught.value.status == 400
    return caught.value.message


def test_a_plain_chat_request_never_loads_the_tool_rules():
    assert not carries_tools(chat())
    assert carries_tools(chat(tools=[WEATHER]))
    assert carries_tools({"messages": [{"role": "tool", "content": "12 C"}]})


def test_tool_choice_is_applied_for_transformers_serve_and_passed_to_vllm():
    auto = tools_shaped(chat(tools=[WEATHER, TIME], tool_choice="auto", parallel_tool_calls=False), True)
    assert auto["tools"] == [WEATHER, TIME] and "tool_choice" not in auto and "parallel_tool_calls" not in auto
    assert "tools" not in tools_shaped(chat(tools=[WEATHER, TIME], tool_choice="none"), True)
    named = tools_shaped(chat(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}),
                         True)
    assert named["tools"] == [TIME]
    assert "cannot be enforced" in refused(chat(tools=[WEATHER], tool_choice="required"))
    vllm = tools_shaped(chat(tools=[WEATHER], tool_choice="required", parallel_tool_calls=True), False)
    assert vllm["tool_choice"] == "required" and vllm["parallel_tool_calls"] is True  # vLLM enforces it itself


@pytest.mark.parametrize("fields, words", [
    ({"tools": "get_weather"}, "tools must be a non-empty list"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0] must be"),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools[0].function.name must be"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name 'get_weather' is given twice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                             "properties": {"x": {"type": 7}}}}}]},
     "tools[0].function.parameters is not a valid JSON Schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters must describe an object"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice must be auto, none, required"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice names 'nope', which is not in tools (get_weather)"),
    ({"tool_choice": "auto"}, "tool_choice 'auto' needs tools"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls must be true or false"),
])
def test_bad_tool_fields_name_the_field_and_the_fix(fields, words):
    assert words in refused(chat(**fields))


def test_malformed_tool_turns_are_refused_before_the_engine_sees_them():
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{city: Oslo"}}
    body = {"model": "m", "messages": [{"role": "user", "content": "?"},
                                       {"role": "assistant", "content": "", "tool_calls": [call]}]}
    assert "messages[1].tool_calls[0].function.arguments is not JSON" in refused(body)
    body["messages"][1]["tool_calls"] = [{"function": "get_weather"}]  # a string where an object belongs
    assert "messages[1].tool_calls[0] must be" in refused(body)
    body["messages"][1]["tool_calls"] = [{"function": {"name": "f", "arguments": "[1, 2]"}}]
    assert "arguments must be a JSON object" in refused(body)
    body["messages"] = [{"role": "user", "content": "?", "tool_calls": []}]
    assert "only an assistant turn has tool_calls" in refused(body)


def test_results_without_an_id_are_paired_with_their_calls_by_walking_back():
    calls = [{"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
             {"id": "call_b", "type": "function", "function": {"name": "get_weather",
                                                               "arguments": json.dumps({"city": "Bergen"})}}]
    body = chat(tools=[WEATHER], messages=[
        {"role": "user", "content": "Oslo and Bergen?"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": "12 C", "tool_call_id": "call_a"},
        {"role": "tool", "content": "9 C"}])
    shaped = tools_shaped(body, True)
    assert [m.get("tool_call_id") for m in shaped["messages"]] == [None, None, "call_a", "call_b"]
    assert body["messages"][3].get("tool_call_id") is None  # the client's request is not changed
