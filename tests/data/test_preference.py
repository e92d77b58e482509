"""Preference/RL data shapes: detection says what it chose; rows come out in TRL's shapes."""
from __future__ import annotations

import pytest

from trainer_core.data import DatasetError
from trainer_core.data.preference import UNREADABLE_TURNS, detect_shape, normalize, split_shared_prefix

U = lambda text: {"role": "user", "content": text}  # noqa: E731
A = lambda text: {"role": "assistant", "content": text}  # noqa: E731


def test_text_pairs():
    rows = [{"prompt": "Hi?", "chosen": "Hello!", "rejected": "Go away."},
            {"prompt": "Q", "chosen": "same", "rejected": "same"}, {"prompt": "Q", "chosen": "", "rejected": "x"}]
    data = normalize(rows, "pairs")
    assert data.rows == [{"prompt": "Hi?", "chosen": "Hello!", "rejected": "Go away."}]
    assert data.dropped == {"chosen equals rejected": 1, "chosen or rejected is empty or not text": 1}
    assert data.reason == "found chosen and rejected columns with a prompt column"


def test_hh_style_pairs_split_the_shared_prefix():
    chosen = [U("Hi"), A("Hello"), U("Capital of France?"), A("Paris.")]
    rejected = [U("Hi"), A("Hello"), U("Capital of France?"), A("No idea.")]
    data = normalize([{"chosen": chosen, "rejected": rejected}], "pairs", system_prompt="Be brief.")
    assert data.rows == [{"prompt": [{"role": "system", "content": "Be brief."}, U("Hi"), A("Hello"),
                                     U("Capital of France?")],
                          "chosen": [A("Paris.")], "rejected": [A("No idea.")]}]
    assert "the shared prefix is the prompt" in data.reason


def test_shared_prefix_never_ends_with_an_answer():
    chosen, rejected = [U("a"), A("same start")], [U("a"), A("same start")]
    assert split_shared_prefix(chosen, rejected) == ([U("a")], [A("same start")], [A("same start")])


def test_sharegpt_turns_in_pairs():
    row = {"prompt": "Why?", "chosen": [{"from": "gpt", "value": "Because."}],
           "rejected": [{"from": "gpt", "value": "No."}]}
    assert normalize([row], "pairs").rows == [{"prompt": [U("Why?")], "chosen": [A("Because.")],
                                                "rejected": [A("No.")]}]


def test_kto_labels_and_unpairing():
    rows = [{"prompt": "p", "completion": "good", "label": True}, {"prompt": "p", "completion": "bad", "label": "no"},
            {"prompt": "p", "completion": "?", "label": "maybe"}]
    data = normalize(rows, "kto")
    assert [r["label"] for r in data.rows] == [True, False]
    assert data.dropped == {"label is not true/false": 1}
    pairs = normalize([{"prompt": "p", "chosen": "c", "rejected": "r"}], "kto")
    assert pairs.rows == [{"prompt": "p", "completion": "c", "label": True},
                          {"prompt": "p", "completion": "r", "label": False}]
    assert pairs.reason.endswith("each pair unpaired into a good and a bad completion")


def test_prompts_keep_other_columns_for_rewards():
    rows = [{"prompt": "2+2?", "answer": "4", "level": 1},
            {"messages": [U("3+3?"), A("6")], "id": 7}]
    data = normalize(rows[:1], "prompts")
    assert data.rows == [{"prompt": "2+2?", "answer": "4", "level": 1}]
    chat = normalize(rows[1:], "prompts")
    assert chat.rows == [{"prompt": [U("3+3?")], "id": 7, "answer": "6"}]


def test_prompts_keep_their_tool_calls_and_results():
    """A few-shot GRPO prompt whose examples call a tool keeps the calls (normal form, arguments as JSON text) and the
    results paired with them; before, the calls were dropped and the examples showed empty answers."""
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": {"a": 2, "b": 3}}}]}
    rows = [{"prompt": [U("2 times 3?"), call, {"role": "tool", "content": "6"}, A("6"), U("4 times 5?")],
             "answer": "20"}]
    data = normalize(rows, "prompts")
    assert data.rows == [{"prompt": [
        U("2 times 3?"),
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1_0", "type": "function", "function": {"name": "multiply", "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "content": "6", "tool_call_id": "call_1_0", "name": "multiply"},
        A("6"), U("4 times 5?")], "answer": "20"}]
    bad = dict(call, tool_calls=[{"type": "function", "function": {"name": "multiply", "arguments": "[1, 2]"}}])
    assert normalize(rows + [{"prompt": [U("q"), bad, U("r")]}], "prompts").dropped == {UNREADABLE_TURNS: 1}


def test_mixed_text_and_chat_keeps_the_majority_and_counts_the_rest():
    rows = [{"prompt": "a", "chosen": "b", "rejected": "c"}, {"prompt": "d", "chosen": "e", "rejected": "f"},
            {"chosen": [U("x"), A("y")], "rejected": [U("x"), A("z")]}]
    data = normalize(rows, "pairs")
    assert len(data.rows) == 2 and data.dropped == {"mixes text and conversational rows": 1}


def test_wrong_shape_for_the_method_names_both():
    with pytest.raises(DatasetError) as caught:
        normalize([{"prompt": "p", "completion": "c", "label": True}], "pairs")
    assert caught.value.field == "format_type"
    assert "this method needs prompt/chosen/rejected columns" in caught.value.message
    with pytest.raises(DatasetError, match="could not tell the data's shape: the columns are 'text'"):
        detect_shape([{"text": "raw"}])


def test_column_mapping_and_no_usable_rows():
    data = normalize([{"q": "p", "good": "g", "bad": "b"}], "pairs", {"prompt": "q", "chosen": "good", "rejected": "bad"})
    assert data.rows == [{"prompt": "p", "chosen": "g", "rejected": "b"}]
    with pytest.raises(DatasetError, match="no usable rows: all 1 rows were dropped"):
        normalize([{"prompt": "p", "chosen": "x", "rejected": "x"}], "pairs")
