"""Built-in GRPO rewards and the grpo.rewards settings: exact outputs, every problem named."""
from __future__ import annotations

import pytest

from trainer_core.rewards import builtin
from trainer_core.rewards.spec import function_problem, needs_admin, parse_rewards

CHAT = [[{"role": "assistant", "content": "one two three"}]]


def test_length_scores_distance_from_target_in_target_units():
    out = builtin.length([], ["a b c d", "a b", "a b c d e f g h", ""], target=4)
    assert out == [0.0, -0.5, -1.0, -1.0]
    assert builtin.length([], ["a b c d e f"], target=4, tolerance=1) == [-0.25]
    assert builtin.length([], ["abcd"], target=4, unit="chars") == [0.0]
    assert builtin.length([], CHAT, target=3) == [0.0]  # conversational completions are read by content


def test_format_preset_and_pattern():
    good = "<think>2+2 is 4</think>\n<answer>4</answer>"
    assert builtin.format_match([], [good, "4", "<answer>4</answer>"], preset="think_answer") == [1.0, 0.0, 0.0]
    assert builtin.format_match([], ["Yes.", "yes"], pattern=r"[A-Z].*\.") == [1.0, 0.0]


@pytest.mark.parametrize("mode,extract,completion,reference,expected", [
    ("normalized", "tag", "<answer> Paris! </answer>", "paris", 1.0),
    ("exact", "tag", "<answer>Paris</answer>", "paris", 0.0),
    ("numeric", "last_number", "so 3 + 4 = 7, then 1,000", "#### 1000", 1.0),
    ("numeric", "tag", "<answer>72.0</answer>", "Natalia sold 72", 1.0),
    ("numeric", "tag", "no tag 72", "72", 0.0),
    ("normalized", "whole", "  The END ", "the end", 1.0),
])
def test_answer_match(mode, extract, completion, reference, expected):
    assert builtin.answer_match([], [completion], mode=mode, extract=extract, answer=[reference]) == [expected]


def test_answer_match_none_reference_and_missing_column():
    assert builtin.answer_match([], ["<answer>x</answer>"], answer=[None]) == [None]
    with pytest.raises(KeyError, match="needs a 'gold' column"):
        builtin.answer_match([], ["x"], column="gold", answer=["x"])


def test_json_valid_with_and_without_schema():
    schema = {"type": "object", "required": ["a"]}
    texts = ['{"a": 1}', '```json\n{"b": 2}\n```', "not json", "[" * 5000]
    assert builtin.json_valid([], texts) == [1.0, 1.0, 0.0, 0.0]
    assert builtin.json_valid([], texts, schema=schema) == [1.0, 0.0, 0.0, 0.0]


def test_keywords_and_repetition():
    assert builtin.contains([], ["Hello World", "hello"], keywords=["hello", "world"]) == [1.0, 0.5]
    assert builtin.contains([], ["Hello"], keywords=["hello"], case_sensitive=True) == [0.0]
    assert builtin.not_contains([], ["as an AI model"], keywords=["as an ai", "sorry"]) == [-0.5]
    assert builtin.no_repetition([], ["a b c d", "x y x y x y", "a"], ngram=2) == [0.0, -0.6, 0.0]


def test_every_builtin_has_documented_params():
    assert set(builtin.PARAMS) == set(builtin.BUILTINS)


def test_parse_rewards_names_and_defaults():
    specs, problems = parse_rewards(["format", {"type": "length", "target": 10, "weight": 0.5},
                                     {"type": "length"}, {"python": "r.py", "function": "mine"}])
    assert problems == []
    assert [(s.kind, s.name, s.weight) for s in specs] == [
        ("format", "format", 1.0), ("length", "length", 0.5), ("length", "length_2", 1.0),
        ("python", "mine", 1.0)]
    assert specs[1].params == {"target": 10}
    assert needs_admin(specs) and not needs_admin(specs[:3])


def test_parse_rewards_collects_every_problem():
    _, problems = parse_rewards([
        {"type": "lenght"}, {"type": "length", "target": "ten", "colour": 1}, {"type": "format", "pattern": "("},
        {"type": "contains", "keywords": []}, {"type": "length", "weight": float("nan")},
        {"python": "", "function": "f"}, {"python": "a.py", "function": "not a name"}, 42,
        {"type": "json_valid", "schema": {"type": "nonsense"}}, {"type": "answer_match", "mode": "fuzzy"}])
    fields = [field for field, _ in problems]
    assert fields == ["grpo.rewards[0].type", "grpo.rewards[1].target", "grpo.rewards[1].colour",
                      "grpo.rewards[2].pattern", "grpo.rewards[3].keywords", "grpo.rewards[4].weight",
                      "grpo.rewards[5].python", "grpo.rewards[6].function", "grpo.rewards[7]",
                      "grpo.rewards[8].schema", "grpo.rewards[9].mode"]
    assert "choose one of length, format" in problems[0][1]
    assert parse_rewards({"type": "length"})[1] == [("grpo.rewards", "must be a list of rewards, e.g. "
                                                                      "[{type: length, target: 20}]")]


def test_function_problem_reads_without_running():
    assert function_problem("import os\nos._exit(3)\ndef r(prompts, completions, **kw):\n    return []\n", "r") is None
    assert function_problem("def other(): pass\n", "r") == "the file defines no top-level function 'r'"
    assert function_problem("def r(:\n", "r").startswith("the file does not parse: line 1")
    assert function_problem("async def r(p, c): pass\n", "r") == "r is async: a reward function must be a plain def"


def nested_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def test_a_json_schema_nested_too_deep_is_a_field_error_not_a_recursion_error():
    # 200 levels made jsonschema's check_schema raise RecursionError out of validation (issue 31)
    _, problems = parse_rewards([{"type": "json_valid", "schema": nested_schema(200)}])
    assert problems == [("grpo.rewards[0].schema", "nested 401 levels deep: at most 64 (flatten it, or name repeated "
                                                   "parts under $defs and point to them with $ref)")]
    assert parse_rewards([{"type": "json_valid", "schema": nested_schema(20)}])[1] == []


def test_a_completion_too_deep_to_validate_scores_zero_instead_of_raising():
    recursive = {"type": "array", "items": {"$ref": "#"}}
    assert builtin.json_valid([], ["[" * 400 + "]" * 400, "[[]]"], schema=recursive) == [0.0, 1.0]
