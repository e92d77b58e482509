"""Degeneration checks of sample answers: each kind, exact findings, and healthy answers pass."""
from __future__ import annotations

import pytest

from trainer_core.evaluation import samples_check
from trainer_core.evaluation.samples_check import EMPTY, REPETITION, TEMPLATE_LEAK, check

HEALTHY = [
    "The capital of France is Paris.",
    "Here are three fruits:\n- apple\n- banana\n- cherry",
    "Paris is the capital of France. Berlin is the capital of Germany. Madrid is the capital of Spain.",
    '{"name": "Ada", "age": 36}',
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))",
    "Ha, that's a good one! Ha ha.",  # a short repeat inside a normal answer
    "Sleep matters because it restores the body.\n\n* It helps memory.\n* It keeps the immune system strong.",
    "¡Buenos días!",
    "東京は日本の首都です。",
]


@pytest.mark.parametrize("text", HEALTHY)
def test_healthy_answers_pass(text):
    assert check(text) == {}


@pytest.mark.parametrize("text", ["", " ", "\n\n\n", "\t \n"])
def test_an_empty_or_blank_answer_is_empty_and_nothing_else(text):
    assert check(text) == {EMPTY: "the answer is empty"}


def test_a_sentence_looping_to_the_end_is_found_with_its_unit_and_share():
    assert check("I am a bot. " * 6) == {REPETITION: "'I am a bot.' repeated 6 times, 100% of the answer"}


def test_a_loop_after_a_good_start_counts_when_it_covers_most_of_the_answer():
    found = check("The answer is 4. " + "no " * 12)
    assert found == {REPETITION: "'no' repeated 12 times, 71% of the answer"}


def test_a_short_loop_in_a_long_answer_is_not_a_loop():
    text = "Here is a long and varied answer that explains the idea in plenty of words. " * 1 + "ok ok ok"
    assert check(text) == {}


@pytest.mark.parametrize("text, unit", [("!!!!!!!!!!!!", "'!'"), ("哈哈哈哈哈哈哈哈哈哈", "'哈'"),
                                        ("abcabcabcabcabc", "'abc'")])
def test_loops_without_spaces_are_found_by_characters(text, unit):
    assert check(text)[REPETITION].startswith(f"{unit} repeated")


def test_exactly_the_threshold_share_is_a_loop_and_just_below_is_not():
    words = "one two three four five six seven eight nine ten".split()
    assert check(" ".join(words + ["go"] * 10)).keys() == {REPETITION}  # 10 of 20 words: 50%
    assert check(" ".join(words + ["eleven"] + ["go"] * 9)) == {}  # 9 of 20


def test_two_repeats_are_not_a_loop():
    assert check("Thank you. Thank you.") == {}


@pytest.mark.parametrize("token", samples_check.TEMPLATE_TOKENS)
def test_every_known_template_token_leaking_is_found(token):
    assert check(f"Sure, here it is{token} and more") == {TEMPLATE_LEAK: f"the answer contains {token}"}


def test_the_tokenizers_own_special_tokens_count_and_tiny_ones_do_not():
    text = "Answer <|my_turn_end|> then a"
    assert check(text) == {}
    assert check(text, ["<|my_turn_end|>", "a", "", None]) == {TEMPLATE_LEAK: "the answer contains <|my_turn_end|>"}


def test_several_kinds_are_reported_together():
    found = check("<|im_start|>assistant " * 5)
    assert set(found) == {REPETITION, TEMPLATE_LEAK}
    assert found[TEMPLATE_LEAK] == "the answer contains <|im_start|>"


def test_a_long_unit_is_shown_cut():
    unit = "This sentence is rather long and it keeps coming back again. "
    found = check(unit * 4)[REPETITION]
    assert found == "'This sentence is rather long and it kee…' repeated 4 times, 100% of the answer"
