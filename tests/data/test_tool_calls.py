"""Tool calls: results paired with their calls (every rule of the walk-back), the layouts read into one normal form,
the normal form rendered back for a template, and a model's Hermes calls parsed and scored."""
from __future__ import annotations

import json

import pytest

from trainer_core.data import formats
from trainer_core.data.tool_calls import (CallScore, ToolFormatError, call_accuracy, first_reply_case, normalize_call,
                                          normalize_tools, pair_tool_results, parse_hermes_calls, row_calls,
                                          score_calls, template_messages)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


def call(cid, name, args="{}"):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def ids(messages):
    return [(m.get("tool_call_id"), m.get("name")) for m in messages if m["role"] == "tool"]


# ---------------------------------------------------------------------- pairing
def test_explicit_ids_are_kept_and_names_filled_from_the_call():
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "tool_calls": [call("a", "f"), call("b", "g")]},
                {"role": "tool", "tool_call_id": "b", "content": "2"},
                {"role": "tool", "tool_call_id": "a", "content": "1"}]
    assert ids(pair_tool_results(messages)) == [("b", "g"), ("a", "f")]


def test_results_without_ids_take_the_calls_in_order():
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "tool_calls": [call("a", "f"), call("b", "g")]},
                {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}]
    assert ids(pair_tool_results(messages)) == [("a", "f"), ("b", "g")]


def test_a_matching_function_name_wins_over_order():
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "tool_calls": [call("a", "f"), call("b", "g")]},
                {"role": "tool", "name": "g", "content": "2"}, {"role": "tool", "content": "1"}]
    assert ids(pair_tool_results(messages)) == [("b", "g"), ("a", "f")]


def test_given_ids_reserve_their_calls_before_any_pairing():
    # the explicit answer to call_a comes AFTER the id-less one: the id-less one still resolves to call_b
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "tool_calls": [call("call_a", "f"), call("call_b", "f")]},
                {"role": "tool", "content": "x"}, {"role": "tool", "tool_call_id": "call_a", "content": "y"}]
    assert ids(pair_tool_results(messages)) == [("call_b", "f"), ("call_a", "f")]


def test_a_name_match_already_answered_falls_back_to_the_first_free_call():
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "tool_calls": [call("a", "f"), call("b", "g")]},
                {"role": "tool", "tool_call_id": "a", "content": "1"}, {"role": "tool", "name": "f", "content": "2"}]
    assert ids(pair_tool_results(messages)) == [("a", "f"), ("b", "f")]


def test_the_walk_back_passes_answers_and_earlier_results_but_never_a_user_turn():
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "tool_calls": [call("a", "f")]},
                {"role": "tool", "content": "1"},
                {"role": "assistant", "content": "done"},
                {"role": "tool", "content": "late"},  # past the answer: still call a's turn, but a is answered
                {"role": "user", "content": "again"},
                {"role": "tool", "content": "orphan"}]  # a user turn stands between it and any call
    assert ids(pair_tool_results(messages)) == [("a", "f"), ("call_4", None), ("call_6", None)]


def test_the_most_recent_calling_turn_owns_the_result():
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "tool_calls": [call("a", "f")]}, {"role": "tool", "content": "1"},
                {"role": "assistant", "tool_calls": [call("b", "f")]}, {"role": "tool", "content": "2"}]
    assert ids(pair_tool_results(messages)) == [("a", "f"), ("b", "f")]


def test_more_results_than_calls_get_a_made_up_id():
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call("a", "f")]},
                {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}]
    assert ids(pair_tool_results(messages)) == [("a", "f"), ("call_3", None)]


def test_a_made_up_id_never_collides_with_an_existing_one():
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call("call_3", "f")]},
                {"role": "tool", "tool_call_id": "call_3", "content": "1"}, {"role": "tool", "content": "2"}]
    assert ids(pair_tool_results(messages)) == [("call_3", "f"), ("call_3_1", None)]


def test_a_malformed_call_owns_nothing_and_does_not_raise():
    string_function = {"id": "a", "type": "function", "function": "get_weather"}
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [string_function]},
                {"role": "tool", "name": "get_weather", "content": "1"}]
    assert ids(pair_tool_results(messages)) == [("call_2", "get_weather")]
    mixed = [{"role": "user", "content": "q"},
             {"role": "assistant", "tool_calls": [string_function, call("b", "g"), {"function": {"name": "h"}}]},
             {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}]
    assert ids(pair_tool_results(mixed)) == [("b", "g"), ("call_3", None)]


def test_a_result_before_any_call_and_the_input_unchanged():
    messages = [{"role": "system", "content": "s"}, {"role": "tool", "content": "1"}]
    before = json.dumps(messages)
    assert ids(pair_tool_results(messages)) == [("call_1", None)]
    assert json.dumps(messages) == before


# ---------------------------------------------------------------------- the normal form
def test_calls_and_tools_in_every_accepted_spelling():
    assert normalize_call({"id": "x", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
                          "d") == call("x", "f", '{"a": 1}')
    assert normalize_call({"name": "f", "arguments": {"a": "é"}}, "d") == call("d", "f", '{"a": "é"}')
    assert normalize_call('{"name": "f", "arguments": {}}', "d") == call("d", "f", "{}")
    assert normalize_tools(json.dumps([WEATHER])) == [WEATHER]
    assert normalize_tools([WEATHER["function"]]) == [WEATHER]
    assert normalize_tools(None) == [] and normalize_tools("") == []
    xlam = [{"name": "pow", "description": "x to the n",
             "parameters": {"x": {"type": "float", "description": "base"}, "n": {"type": "int, optional",
                                                                                  "default": 2}}}]
    assert normalize_tools(json.dumps(xlam)) == [{"type": "function", "function": {
        "name": "pow", "description": "x to the n",
        "parameters": {"type": "object", "properties": {"x": {"type": "number", "description": "base"},
                                                        "n": {"type": "integer"}}, "required": ["x"]}}}]


@pytest.mark.parametrize("bad, message", [
    ({"function": "f"}, "a tool call's 'function' must be an object with 'name' and 'arguments'"),
    ({"function": {"arguments": "{}"}}, "a tool call has no function 'name'"),
    ({"name": "f", "arguments": "[1]"}, "the arguments of the call to 'f' must be a JSON object"),
    ("{not json", "not valid JSON (Expecting property name enclosed in double quotes at character 1)"),
])
def test_malformed_calls_say_what_is_wrong(bad, message):
    with pytest.raises(ToolFormatError) as caught:
        normalize_call(bad, "d")
    assert str(caught.value) == message


def test_template_messages_drop_arrow_nulls_and_parse_arguments_and_tools():
    row = {"messages": [{"role": "user", "content": "q", "tool_calls": None, "tool_call_id": None, "name": None},
                        {"role": "assistant", "content": "", "tool_calls": [call("a", "get_weather", '{"city": "Oslo"}')],
                         "tool_call_id": None, "name": None},
                        {"role": "tool", "content": "4C", "tool_calls": None, "tool_call_id": "a", "name": "get_weather"}],
           "tools": json.dumps([WEATHER])}
    messages, tools = template_messages(row)
    assert messages == [{"role": "user", "content": "q"},
                        {"role": "assistant", "content": "",
                         "tool_calls": [{"id": "a", "type": "function",
                                         "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
                        {"role": "tool", "content": "4C", "tool_call_id": "a", "name": "get_weather"}]
    assert tools == [WEATHER]
    assert row_calls(row) == [("get_weather", {"city": "Oslo"})]
    assert template_messages({"messages": [{"role": "user", "content": "q"}], "tools": None})[1] is None


# ---------------------------------------------------------------------- the layouts, through data.formats
def normalized(rows, fmt="auto"):
    return formats.normalize_rows(rows, fmt)


def test_openai_rows_with_tools_read_into_the_normal_form():
    rows = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Oslo?"},
                          {"role": "assistant", "content": None, "tool_calls": [
                              {"id": "c1", "type": "function",
                               "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
                          {"role": "tool", "tool_call_id": "c1", "content": {"temp": 4}},
                          {"role": "assistant", "content": "4 degrees."}],
             "tools": [WEATHER]}]
    data = normalized(rows)
    assert data.format == "chatml"
    assert data.rows == [{"messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "get_weather", '{"city": "Oslo"}')]},
        {"role": "tool", "content": '{"temp": 4}', "tool_call_id": "c1", "name": "get_weather"},
        {"role": "assistant", "content": "4 degrees."}], "tools": json.dumps([WEATHER])}]


def test_sharegpt_function_call_and_observation_turns():
    rows = [{"conversations": [{"from": "human", "value": "Oslo and Rome?"},
                               {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Oslo"}}'},
                               {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Rome"}}'},
                               {"from": "observation", "value": "4C"}, {"from": "observation", "value": "19C"},
                               {"from": "gpt", "value": "Cold and warm."}],
             "tools": json.dumps([WEATHER])}]
    data = normalized(rows)
    assert data.format == "sharegpt"
    assert data.rows[0]["messages"][1:4] == [
        {"role": "assistant", "content": "", "tool_calls": [call("call_1_0", "get_weather", '{"city": "Oslo"}'),
                                                            call("call_2_0", "get_weather", '{"city": "Rome"}')]},
        {"role": "tool", "content": "4C", "tool_call_id": "call_1_0", "name": "get_weather"},
        {"role": "tool", "content": "19C", "tool_call_id": "call_2_0", "name": "get_weather"}]


def test_xlam_rows():
    rows = [{"query": "Weather in Oslo?", "tools": json.dumps([WEATHER["function"]]),
             "answers": json.dumps([{"name": "get_weather", "arguments": {"city": "Oslo"}}])}]
    data = normalized(rows)
    assert (data.format, data.reason) == ("xlam", "found 'query', 'answers' and 'tools' columns (tool calls, xLAM layout)")
    assert data.rows == [{"messages": [{"role": "user", "content": "Weather in Oslo?"},
                                       {"role": "assistant", "content": "",
                                        "tool_calls": [call("call_1_0", "get_weather", '{"city": "Oslo"}')]}],
                          "tools": json.dumps([WEATHER])}]


def test_bad_tool_rows_are_dropped_with_their_reason():
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "tools": [WEATHER]}
    rows = [good,
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"function": "f"}]}]},
            {"messages": good["messages"], "tools": "{oops"}]
    data = normalized(rows)
    assert len(data.rows) == 1
    assert data.dropped == {"malformed tool call": 1, "malformed tools": 1}
    assert data.drop_examples == {
        "malformed tool call": ["a tool call's 'function' must be an object with 'name' and 'arguments'"],
        "malformed tools": ["not valid JSON (Expecting property name enclosed in double quotes at character 1)"]}


def test_rows_without_tools_read_exactly_as_before():
    rows = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]
    assert normalized(rows).rows == [{"messages": [{"role": "user", "content": "q"},
                                                   {"role": "assistant", "content": "a"}]}]


# ---------------------------------------------------------------------- a model's calls read back and scored
def test_hermes_calls_parsed_from_a_generation():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "convert", "arguments": "{\\"x\\": 1}"}\n</tool_call>\n<tool_call>{oops}</tool_call>'
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}')  # stopped before the closing tag
    parsed = parse_hermes_calls(text)
    assert parsed.calls == (("get_weather", {"city": "Oslo"}), ("convert", {"x": 1}), ("get_weather", {"city": "Rome"}))
    assert parsed.invalid == 1
    assert parse_hermes_calls("No call here.").calls == ()


def test_scores_and_accuracy():
    expected = [("get_weather", {"city": "Oslo"})]
    right = '<tool_call>{"arguments": {"city": "Oslo"}, "name": "get_weather"}</tool_call>'
    wrong_args = '<tool_call>{"name": "get_weather", "arguments": {"city": "Osl"}}</tool_call>'
    assert score_calls(expected, right) == CallScore(True, True)
    assert score_calls(expected, wrong_args) == CallScore(True, False)
    assert score_calls(expected, "It is sunny.") == CallScore(False, False)
    assert score_calls([], "It is sunny.") == CallScore(True, True)
    scores = [score_calls(expected, t) for t in (right, wrong_args, "no", right)]
    assert call_accuracy(scores) == {"name_accuracy": 0.75, "exact_accuracy": 0.5}
    assert call_accuracy([]) == {"name_accuracy": 0.0, "exact_accuracy": 0.0}


# ---------------------------------------------------------------------- rows checked against their tools
def tool_row(*calls, tools=(WEATHER,)):
    return {"messages": [{"role": "user", "content": "q"},
                         {"role": "assistant", "content": "", "tool_calls": [call(f"c{i}", n, json.dumps(a))
                                                                             for i, (n, a) in enumerate(calls)]}],
            "tools": json.dumps(list(tools))}


def test_rows_flagged_for_unknown_tools_and_arguments_that_do_not_fit():
    from trainer_core.data.tool_schema import row_problems

    assert row_problems(tool_row(("get_weather", {"city": "Oslo"}))) == []
    assert row_problems(tool_row(("get_wether", {"city": "Oslo"}), ("get_weather", {"town": "Oslo"}),
                                 ("get_weather", {"city": 3}))) == [
        "calls 'get_wether', which is not among the row's tools (get_weather): add the tool to the row's tools or "
        "correct the call's name",
        "the arguments of 'get_weather' do not fit its schema: 'city' is a required property at the top level",
        "the arguments of 'get_weather' do not fit its schema: 3 is not of type 'string' at city"]
    assert row_problems(tool_row(("f", {}), tools=())) == [
        "calls 'f', which is not among the row's tools (none): add the tool to the row's tools or correct the call's "
        "name"]


def test_a_schema_that_is_not_json_schema_names_the_field_and_the_fix():
    from trainer_core.data.tool_schema import row_problems

    bad = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "objekt"}}}
    assert row_problems(tool_row(("get_weather", {"city": "Oslo"}), tools=(bad,))) == [
        "tools: 'get_weather'.parameters is not valid JSON Schema ('objekt' is not valid under any of the given "
        "schemas at type); fix it to a JSON Schema object, e.g. {\"type\": \"object\", \"properties\": {\"city\": "
        "{\"type\": \"string\"}}}"]


def test_the_first_reply_of_a_held_out_row_is_the_case_scored():
    row = tool_row(("get_weather", {"city": "Oslo"}))
    row["messages"] += [{"role": "tool", "content": "4C", "tool_call_id": "c0"}, {"role": "assistant", "content": "Cold."}]
    assert first_reply_case(row) == ([{"role": "user", "content": "q"}], [("get_weather", {"city": "Oslo"})])
    words = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}]}
    assert first_reply_case(words) == ([{"role": "user", "content": "hi"}], [])
    assert first_reply_case({"messages": [{"role": "user", "content": "hi"}]}) is None
