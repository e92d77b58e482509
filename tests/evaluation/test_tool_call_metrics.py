"""Metric tool_calls: answers scored against the first reply's calls (pure functions), the held-out questions read
from conversations with tools, the judge shown the tools, and the spec refusing data without tools."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.support import ROOT
from trainer_core.config import BUNDLED_MODEL, FieldError
from trainer_core.data.sources import bundled_demo_path
from trainer_core.config.limits import BUNDLED_TOOLS_EVAL
from trainer_core.evaluation import samples as eval_samples
from trainer_core.evaluation import scoring
from trainer_core.evaluation.judge import with_tools
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.jobs import evals
from trainer_core.evaluation.tool_scoring import (ToolCallScore, per_sample, reference_text, score_tool_answer,
                                                  tool_call_metrics)
from trainer_core.specs.model_source import ModelSource

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city"]}}}
CALC = {"type": "function", "function": {"name": "calculate", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}
TOOLS = json.dumps([WEATHER, CALC])


def call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_an_answer_is_scored_call_by_call_and_argument_by_argument():
    expected = [("get_weather", {"city": "Lima", "unit": "c"})]
    assert score_tool_answer(expected, call("get_weather", {"city": "Lima", "unit": "c"}), TOOLS) == ToolCallScore(
        expects_call=True, called=True, name_correct=True, exact=True, arguments_right=2, arguments_expected=2,
        blocks=1, json_valid=1, schema_valid=1)
    # the right function, one argument wrong (and not in the schema's enum)
    assert score_tool_answer(expected, call("get_weather", {"city": "Lima", "unit": "k"}), TOOLS) == ToolCallScore(
        expects_call=True, called=True, name_correct=True, exact=False, arguments_right=1, arguments_expected=2,
        blocks=1, json_valid=1, schema_valid=0)
    # another function: none of its arguments count; an unknown tool fits no schema
    assert score_tool_answer(expected, call("get_time", {"city": "Lima"}), TOOLS) == ToolCallScore(
        expects_call=True, called=True, name_correct=False, exact=False, arguments_right=0, arguments_expected=2,
        blocks=1, json_valid=1, schema_valid=0)
    # a block that is not JSON is a call attempt, not a call
    assert score_tool_answer(expected, "<tool_call>\n{city: Lima}\n</tool_call>", TOOLS) == ToolCallScore(
        expects_call=True, called=True, name_correct=False, exact=False, arguments_right=0, arguments_expected=2,
        blocks=1, json_valid=0, schema_valid=0)
    # no call expected: answering in words is right, calling is wrong
    assert score_tool_answer([], "Hello!", TOOLS) == ToolCallScore(
        expects_call=False, called=False, name_correct=True, exact=True, arguments_right=0, arguments_expected=0,
        blocks=0, json_valid=0, schema_valid=0)
    assert per_sample(score_tool_answer([], call("calculate", {"a": 1, "b": 2}), TOOLS)) == {
        "tool_call": 0.0, "tool_name": 0.0, "tool_exact": 0.0, "tool_arguments": None, "tool_json_valid": 1.0,
        "tool_schema_valid": 1.0}


def test_numbers_compare_as_json_values_and_booleans_are_not_numbers():
    assert score_tool_answer([("calculate", {"a": 2, "b": 3})], call("calculate", {"a": 2.0, "b": 3}),
                             TOOLS).arguments_right == 2
    assert score_tool_answer([("calculate", {"a": 1, "b": 0})], call("calculate", {"a": True, "b": False}),
                             TOOLS).arguments_right == 0


def test_overall_metrics_over_the_rows():
    scores = [score_tool_answer([("get_weather", {"city": "Lima"})], call("get_weather", {"city": "Lima"}), TOOLS),
              score_tool_answer([("calculate", {"a": 2, "b": 3})], call("calculate", {"a": 2, "b": 4}), TOOLS),
              score_tool_answer([("calculate", {"a": 1, "b": 1})], "It is 2.", TOOLS),
              score_tool_answer([], "Hi!", TOOLS)]
    assert tool_call_metrics(scores) == {
        "tool_call_accuracy": 0.75, "tool_name_accuracy": 0.75, "tool_exact_accuracy": 0.5,
        "tool_argument_accuracy": 2 / 5, "tool_json_valid": 1.0, "tool_schema_valid": 1.0, "tool_rows_calling": 3}
    assert tool_call_metrics([]) == {"tool_call_accuracy": None, "tool_name_accuracy": None,
                                     "tool_exact_accuracy": None, "tool_argument_accuracy": None,
                                     "tool_json_valid": None, "tool_schema_valid": None, "tool_rows_calling": 0}
    rows = [scoring.SampleScores(tool=score) for score in scores]
    assert scoring.overall(rows, ["a"] * 4, ["b"] * 4, ["tool_calls"]) == {"samples": 4, **tool_call_metrics(scores)}


def test_the_reference_reply_is_written_as_the_hermes_template_writes_it():
    assert reference_text(None, [("get_weather", {"city": "Lima"})]) == \
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call>'
    assert reference_text("Let me check.", [("calculate", {"a": 1, "b": 2})]) == \
        'Let me check.\n<tool_call>\n{"name": "calculate", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert reference_text("Hello!", []) == "Hello!"


def test_the_judge_is_shown_the_tools():
    shown = with_tools("What's the weather in Lima?", json.dumps([WEATHER]))
    assert shown == ("What's the weather in Lima?\n\nTools the assistant may call (it writes a call as "
                     "<tool_call>{\"name\", \"arguments\"}</tool_call>):\n" + json.dumps(WEATHER["function"]))
    assert with_tools("Hi", "") == "Hi"


@pytest.fixture
def held_out(home, tmp_path):
    target = tmp_path / "tools_eval.jsonl"
    shutil.copy(bundled_demo_path(BUNDLED_TOOLS_EVAL), target)
    return target


def spec(**values) -> EvalSpec:
    return EvalSpec(**{"source": ModelSource(model=BUNDLED_MODEL), "metrics": ["tool_calls"], **values})


def test_held_out_questions_end_at_the_first_reply_with_their_tools(held_out):
    samples, left_out = eval_samples.load_samples(spec(data=str(held_out)))
    rows = [json.loads(line) for line in held_out.read_text().splitlines()]
    assert len(samples) == len(rows) and left_out is None
    greeting, weather = samples[0], samples[1]
    assert greeting.prompt == [{"role": "user", "content": "Hi there!"}] and greeting.calls == ()
    assert greeting.reference == rows[0]["messages"][1]["content"]
    assert [m["content"] for m in weather.prompt] == ["What's the weather in Lima?"]
    assert weather.calls == (("get_weather", {"city": "Lima"}),)
    assert json.loads(weather.tools) == rows[1]["tools"]
    assert weather.reference == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call>'
    assert spec(data=str(held_out)).validate() == []
    bundled = evals.prepared(spec(data="bundled:demo-tools-eval"))  # named, not pinned to a path outside the roots
    assert bundled.data == "bundled:demo-tools-eval" and bundled.validate() == []


def test_tool_calls_needs_rows_with_tools_and_its_own_reading_of_them(held_out):
    plain = held_out.with_name("chatml.jsonl")
    shutil.copy(ROOT / "tests" / "fixtures" / "datasets" / "chatml.jsonl", plain)
    assert spec(data=str(plain)).validate() == [FieldError(
        "data", "tool_calls scores calls against each row's tools, and none of the 2 test rows lists any: give "
                "conversations with a 'tools' list per row (the OpenAI format: tools, assistant tool_calls, role tool "
                "results; ShareGPT function_call/observation turns; or xLAM query/tools/answers), or drop "
                "'tool_calls' from metrics")]
    mixed = spec(data=str(held_out), metrics=["tool_calls", "rouge", "perplexity"]).validate()
    assert mixed == [FieldError("metrics", "tool_calls scores each conversation's first reply, and perplexity read "
                                           "the rows another way: drop perplexity (or run them as a second eval), or "
                                           "drop 'tool_calls'")]
