"""Exact and near-duplicate rows (trainer_core/recipes/dedupe.py): a copy or a one-word edit of a kept row is left
out naming the row it repeats, different rows are kept, a resumed job's rebuilt state catches a duplicate of a row
kept before, and two instances decide the same."""
from __future__ import annotations

import pytest

from trainer_core.recipes.dedupe import Deduper

TEXT = ("The studio reads each document, cuts it into chunks with overlap, asks the teacher model for questions "
        "grounded in every chunk, checks the rows against the validators, removes duplicates, and writes the kept "
        "rows with a card that counts them.")
OTHER = ("Gradient accumulation sums the gradients of several small batches before one optimizer step, so that a "
         "model trained on a small card sees the same effective batch as on a large one, at the cost of time.")


def one_word_changed(text: str) -> str:
    return text.replace("teacher", "tutor")


def test_exact_duplicates_are_named_after_the_row_they_repeat_whatever_the_case_and_spacing():
    deduper = Deduper(["question", "answer"])
    assert deduper.check_and_add({"question": "What is LoRA?", "answer": "A low-rank adapter."}, "r1") is None
    assert deduper.check_and_add({"question": "what  is\nLORA?", "answer": " a low-rank ADAPTER. "}, "r2") == \
        "exact duplicate of r1"
    # the columns are kept apart: the same words split differently between them are another row
    assert deduper.check_and_add({"question": "What is LoRA? A", "answer": "low-rank adapter."}, "r3") is None
    assert len(deduper) == 2


def test_a_one_word_edit_of_a_40_word_text_is_a_near_duplicate_and_different_texts_are_kept():
    assert len(TEXT.split()) == 40
    deduper = Deduper(["text"])
    assert deduper.check_and_add({"text": TEXT}, "row-0") is None
    reason = deduper.check_and_add({"text": one_word_changed(TEXT)}, "row-1")
    assert reason == "near duplicate of row-0 (estimated Jaccard 0.95)"
    assert deduper.check_and_add({"text": OTHER}, "row-2") is None
    assert deduper.check_and_add({"text": TEXT[: len(TEXT) // 2]}, "row-3") is None  # half the text: below 0.8
    assert len(deduper) == 3


def test_the_threshold_decides_what_is_near():
    strict = Deduper(["text"], threshold=0.99)
    assert strict.check_and_add({"text": TEXT}, "a") is None
    assert strict.check_and_add({"text": one_word_changed(TEXT)}, "b") is None  # Jaccard 0.93, estimated 0.95
    exact_only = Deduper(["text"], threshold=1.0)
    assert exact_only.check_and_add({"text": TEXT}, "a") is None
    assert exact_only.check_and_add({"text": one_word_changed(TEXT)}, "b") is None
    assert exact_only.check_and_add({"text": TEXT + " "}, "c") == "exact duplicate of a"


def test_a_resumed_job_rebuilt_with_add_catches_a_duplicate_of_a_row_kept_before_the_kill():
    before = Deduper(["text"])
    kept = {}
    for row_id, text in (("k0", TEXT), ("k1", OTHER)):
        assert before.check_and_add({"text": text}, row_id) is None
        kept[row_id] = {"text": text}
    resumed = Deduper(["text"])
    for row_id, row in kept.items():
        resumed.add(row, row_id)
    assert resumed.check_and_add({"text": OTHER.upper()}, "n0") == "exact duplicate of k1"
    assert resumed.check_and_add({"text": one_word_changed(TEXT)}, "n1") == \
        "near duplicate of k0 (estimated Jaccard 0.95)"
    assert len(resumed) == 2


def test_two_instances_decide_the_same_for_the_same_rows():
    rows = [TEXT, one_word_changed(TEXT), OTHER, OTHER.replace("small", "tiny"), TEXT.replace("reads", "opens"),
            "Short text.", "short  TEXT."]
    results = []
    for _ in range(2):
        deduper = Deduper(["text"], threshold=0.7)
        results.append([deduper.check_and_add({"text": text}, f"r{i}") for i, text in enumerate(rows)])
    assert results[0] == results[1]
    assert results[0] == [None, "near duplicate of r0 (estimated Jaccard 0.95)", None,
                          "near duplicate of r2 (estimated Jaccard 0.85)",
                          "near duplicate of r0 (estimated Jaccard 0.93)", None, "exact duplicate of r5"]


def test_missing_columns_are_empty_and_values_that_are_not_text_count_as_json():
    deduper = Deduper(["question", "answer"])
    assert deduper.text({"question": "Q", "answer": {"b": 1, "a": [1, 2]}}) == 'q\x1f{"a": [1, 2], "b": 1}'
    assert deduper.text({"question": None}) == "\x1f"
    assert deduper.check_and_add({"question": "Only a question here, no answer."}, "x") is None
    assert deduper.check_and_add({"question": "only a question here, no answer.", "answer": None}, "y") == \
        "exact duplicate of x"
    assert deduper.check_and_add({"question": "nul\x00 and \ud800 survive"}, "z") is None


@pytest.mark.parametrize("arguments, message", [
    ({"threshold": 0}, "threshold must be a number above 0 and at most 1 (an estimated Jaccard similarity), not 0"),
    ({"threshold": 1.5}, "threshold must be a number above 0 and at most 1 (an estimated Jaccard similarity), "
                         "not 1.5"),
    ({"threshold": True}, "threshold must be a number above 0 and at most 1 (an estimated Jaccard similarity), "
                          "not True"),
    ({"num_perm": 8}, "num_perm must be an integer from 32 to 1024, not 8"),
    ({"shingle": 0}, "shingle must be an integer from 1 to 64 (characters), not 0"),
    ({"columns": []}, "columns must be a non-empty list of column names, not []"),
])
def test_bad_settings_are_refused_naming_the_setting(arguments, message):
    with pytest.raises(ValueError) as caught:
        Deduper(**{"columns": ["text"], **arguments})
    assert str(caught.value) == message
