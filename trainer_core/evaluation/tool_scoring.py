"""Metric ``tool_calls``: how well a model calls tools, from its answer to a held-out conversation's first question.

Each test row is the conversation before its first assistant reply (``data.tool_calls.first_reply_case``) with the
row's tools; the model's greedy answer is read back as Hermes ``<tool_call>`` blocks (``parse_hermes_calls``) and
scored against the calls that reply makes (none: the right answer is to call nothing):

- ``tool_call_accuracy``: the answer calls when the reply calls, and does not when it does not;
- ``tool_name_accuracy`` / ``tool_exact_accuracy``: the same functions in order / with exactly the same arguments
  (``score_calls``; a row that expects no call is right when the answer calls none);
- ``tool_argument_accuracy``: of the arguments the expected calls give, the share the answer's call to the same
  function at the same position gives with the same value (over all rows' arguments);
- ``tool_json_valid``: of the ``<tool_call>`` blocks written, the share that parse into ``{"name", "arguments"}``;
- ``tool_schema_valid``: of those calls, the share naming one of the row's tools with arguments that fit its JSON
  Schema.

Pure functions (jsonschema for the schemas): the worker scores with them, tests check them on their own.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import jsonschema

from trainer_core.data.tool_calls import ToolFormatError, normalize_tools, parse_hermes_calls, score_calls
from trainer_core.data.tool_schema import schema_problem

METRIC = "tool_calls"
KEYS = ("tool_call_accuracy", "tool_name_accuracy", "tool_exact_accuracy", "tool_argument_accuracy",
        "tool_json_valid", "tool_schema_valid")


@dataclass(frozen=True)
class ToolCallScore:
    expects_call: bool  # the reference reply calls a tool
    called: bool  # the answer wrote at least one <tool_call> block, readable or not
    name_correct: bool
    exact: bool
    arguments_right: int  # expected arguments given with the same value by the matching call
    arguments_expected: int
    blocks: int  # <tool_call> blocks written
    json_valid: int  # of them, the ones that parse into {"name", "arguments"}
    schema_valid: int  # of those calls, the ones naming a row tool whose schema their arguments fit


def score_tool_answer(expected: list[tuple[str, dict]], text: str, tools) -> ToolCallScore:
    """One answer against the calls the reference reply makes; ``tools``: the row's tools (list or JSON text)."""
    parsed = parse_hermes_calls(text)
    got = list(parsed.calls)
    plain = score_calls(expected, text)
    right = sum(_same_arguments(want, have) for want, have in zip(expected, got))
    return ToolCallScore(
        expects_call=bool(expected), called=bool(got) or parsed.invalid > 0, name_correct=plain.name_correct,
        exact=plain.exact, arguments_right=right, arguments_expected=sum(len(arguments) for _, arguments in expected),
        blocks=len(got) + parsed.invalid, json_valid=len(got), schema_valid=sum(_fits(call, tools) for call in got))


def _same_arguments(want: tuple[str, dict], have: tuple[str, dict]) -> int:
    """How many of ``want``'s arguments ``have`` gives with the same value (none when it calls another function)."""
    if want[0] != have[0]:
        return 0
    return sum(1 for key, value in want[1].items() if key in have[1] and _json_equal(have[1][key], value))


def _json_equal(a, b) -> bool:
    """Equal as JSON values (1 and 1.0 are the same number; true is not 1)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) or \
        (type(a) is not bool and type(b) is not bool and isinstance(a, (int, float)) and isinstance(b, (int, float))
         and a == b)


def _fits(call: tuple[str, dict], tools) -> bool:
    """Whether a call names one of ``tools`` and its arguments fit that tool's JSON Schema."""
    try:
        listed = {tool["function"]["name"]: tool for tool in normalize_tools(tools)}
    except ToolFormatError:
        return False
    tool = listed.get(call[0])
    if tool is None or schema_problem(tool) is not None:
        return False
    schema = tool["function"].get("parameters", {})
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
    return validator.is_valid(call[1])


def per_sample(score: ToolCallScore) -> dict:
    """A prediction line's tool columns (1.0/0.0, a share, or None when there was nothing to count)."""
    return {"tool_call": float(score.called == score.expects_call), "tool_name": float(score.name_correct),
            "tool_exact": float(score.exact),
            "tool_arguments": _share(score.arguments_right, score.arguments_expected),
            "tool_json_valid": _share(score.json_valid, score.blocks),
            "tool_schema_valid": _share(score.schema_valid, score.json_valid)}


def tool_call_metrics(scores: list[ToolCallScore]) -> dict:
    """The metric's overall values (``KEYS``; None where nothing was counted) and ``tool_rows_calling``: how many
    rows expect a call."""
    if not scores:
        return {**dict.fromkeys(KEYS), "tool_rows_calling": 0}
    rows = len(scores)
    return {
        "tool_call_accuracy": sum(s.called == s.expects_call for s in scores) / rows,
        "tool_name_accuracy": sum(s.name_correct for s in scores) / rows,
        "tool_exact_accuracy": sum(s.exact for s in scores) / rows,
        "tool_argument_accuracy": _share(sum(s.arguments_right for s in scores),
                                         sum(s.arguments_expected for s in scores)),
        "tool_json_valid": _share(sum(s.json_valid for s in scores), sum(s.blocks for s in scores)),
        "tool_schema_valid": _share(sum(s.schema_valid for s in scores), sum(s.json_valid for s in scores)),
        "tool_rows_calling": sum(s.expects_call for s in scores),
    }


def reference_text(content: str | None, calls: list[tuple[str, dict]]) -> str:
    """The reference reply as the Hermes tool template writes it: its words, then each call in ``<tool_call>`` tags
    (what exact/ROUGE/BLEU and the judge compare the answer with)."""
    parts = [content.strip()] if content and content.strip() else []
    parts += [f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n</tool_call>"
              for name, arguments in calls]
    return "\n".join(parts)


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None
