"""How verify compares answers: token for token (transformers) or text (llama.cpp), naming the first difference."""
from __future__ import annotations

from trainer_core.worker.export_verify import compare, compare_texts


class Letters:
    """A tokenizer stand-in: token id n is the letter chr(96 + n)."""

    def decode(self, ids):
        return "".join(chr(96 + i) for i in ids)


def test_identical_answers_have_no_difference():
    assert compare("merged", ["p1", "p2"], [[1, 2], [3]], [[1, 2], [3]], Letters()) == dict(
        format="merged", identical=2, total=2, first_difference="")


def test_the_first_differing_token_is_named_with_its_prompt():
    result = compare("gguf q8_0", ["first", "second prompt"], [[1, 2], [3, 4, 5]], [[1, 2], [3, 9, 5]], Letters())
    assert (result["identical"], result["total"]) == (1, 2)
    assert result["first_difference"] == "prompt 2 ('second prompt'), token 2: adapter 'd', gguf q8_0 'i'"


def test_an_answer_that_stops_early_differs_at_its_end():
    result = compare("merged", ["p"], [[1, 2, 3]], [[1, 2]], Letters())
    assert result["first_difference"] == "prompt 1 ('p'), token 3: adapter 'c', merged '(end)'"


def test_text_answers_name_the_first_differing_character():
    result = compare_texts("gguf q8_0 (llama.cpp)", ["a", "b"], ["Paris.", "Apples, pears"], ["Paris.", "Apples; pears"])
    assert (result["identical"], result["total"]) == (1, 2)
    assert result["first_difference"] == ("prompt 2 ('b'), character 7: adapter ', pears', gguf q8_0 (llama.cpp) "
                                          "'; pears'")
