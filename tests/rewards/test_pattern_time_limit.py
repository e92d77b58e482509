"""Regexes written by users run with a time limit (issue 31): a `format` pattern or a `json_valid` schema pattern that
backtracks without end is a named error within the limit, not a reward check or a training step that hangs; and one
person runs one reward check at a time."""
from __future__ import annotations

import json
import subprocess
import threading

import pytest

from trainer_core.config import TrainConfig
from trainer_core.rewards import builtin, check
from trainer_core.rewards.spec import parse_rewards

pytestmark = pytest.mark.timeout(120)  # before the fix these matches never ended: fail, don't hang the suite

HOSTILE = "a" * 60  # '(a|aa)+b' tries every way to split 60 a's into 1s and 2s before it gives up: ~1e12 ways


@pytest.fixture
def quick_limit(monkeypatch):
    monkeypatch.setattr(builtin, "PATTERN_TIMEOUT_S", 0.05)  # the limit's size is not what these tests check


def test_the_issues_pattern_scores_without_hanging():
    # '(a+)+b' hung `re` for hours on 60 a's; the regex module settles it at once
    assert builtin.format_match([], [HOSTILE, "aab"], pattern="(a+)+b") == [0.0, 1.0]


def test_a_format_pattern_that_backtracks_without_end_stops_at_the_limit_with_the_fix(quick_limit):
    with pytest.raises(builtin.PatternTimeout) as caught:
        builtin.format_match([], ["aab", HOSTILE], pattern="(a|aa)+b")
    assert str(caught.value) == (
        "the pattern '(a|aa)+b' took longer than 0.05 s on a completion of 60 characters: it backtracks without end "
        "(a repeat inside a repeat, such as (a|aa)+ or (a+)+); rewrite it so that each character can match in one way "
        "only")


def test_a_schema_pattern_that_backtracks_without_end_stops_at_the_limit(quick_limit):
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(a|aa)+b$"}}}
    assert builtin.json_valid([], ['{"code": "aab"}', '{"code": "x"}'], schema=schema) == [1.0, 0.0]
    with pytest.raises(builtin.PatternTimeout, match=r"^the pattern '\^\(a\|aa\)\+b\$' took longer than 0.05 s"):
        builtin.json_valid([], [json.dumps({"code": HOSTILE})], schema=schema)


@pytest.mark.parametrize("schema", [
    {"type": "object", "patternProperties": {"^(a|aa)+b$": {"type": "integer"}}},
    {"type": "object", "patternProperties": {"^(a|aa)+b$": {}}, "additionalProperties": False},
    {"type": "object", "propertyNames": {"pattern": "^(a|aa)+b$"}},
])
def test_property_name_patterns_run_with_the_limit_too(quick_limit, schema):
    assert builtin.json_valid([], ['{"aab": 1}'], schema=schema) == [1.0]
    with pytest.raises(builtin.PatternTimeout):
        builtin.json_valid([], [json.dumps({HOSTILE: 1})], schema=schema)


def test_patterns_the_limit_cannot_reach_are_refused_with_the_fix():
    _, problems = parse_rewards([
        {"type": "json_valid", "schema": {"patternProperties": {"^x": {}}, "unevaluatedProperties": False}},
        {"type": "json_valid", "schema": {"properties": {"a": {"type": "string", "pattern": "(?<bad"}}}},
        {"type": "format", "pattern": "(?<bad"}])
    assert [field for field, _ in problems] == ["grpo.rewards[0].schema", "grpo.rewards[1].schema",
                                                "grpo.rewards[2].pattern"]
    assert problems[0][1] == ("patternProperties with unevaluatedProperties cannot be checked with a time limit: use "
                              "additionalProperties instead of unevaluatedProperties")
    assert problems[1][1] == "not a valid JSON schema ('(?<bad' is not a 'regex')"
    assert problems[2][1].startswith("not a valid regex (")


def grpo_config(tmp_path) -> TrainConfig:
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "2+2?", "answer": "4"}) + "\n")
    return TrainConfig.from_dict({"method": "grpo", "local_datasets": [str(data)],
                                  "grpo": {"rewards": [{"type": "format", "pattern": "(a|aa)+b"}]}})


def test_one_person_runs_one_reward_check_at_a_time(tmp_path, monkeypatch):
    cfg = grpo_config(tmp_path)
    inside, release = threading.Event(), threading.Event()
    reply = json.dumps({"rewards": [], "samples": []})

    def child(args, input, **kwargs):  # the check's child process, held until the test lets it answer
        if json.loads(input)["rows"] == 4:
            inside.set()
            release.wait(60)
        return subprocess.CompletedProcess(args, 0, stdout=reply + "\n", stderr="")

    monkeypatch.setattr(check.subprocess, "run", child)
    first: list = []
    ann = threading.Thread(target=lambda: first.append(check.check_rewards(cfg, who="ann")))
    ann.start()
    try:
        assert inside.wait(60)
        busy = check.check_rewards(cfg, rows=3, who="ann")
        assert [(e.field, e.message) for e in busy.errors] == [
            ("reward_check", "your previous reward check is still running: wait for its result, then check again")]
        assert check.check_rewards(cfg, rows=3, who="bob").errors == ()  # another person is not held up
    finally:
        release.set()
        ann.join(60)
    assert first[0].errors == ()
    assert check.check_rewards(cfg, rows=3, who="ann").errors == ()  # ann's turn ended with her check
