"""Test rows longer than the model's context are left out with one warning, instead of failing the generation
or padding a whole batch to their length (found by the hostile pass). The worker module imports no ML library
at import time, so this runs with a stand-in model and tokenizer."""
from __future__ import annotations

from types import SimpleNamespace

from trainer_core.evaluation.samples import Sample
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.protocol import events as ev
from trainer_core.worker.evaluate import Evaluator


class WordTokenizer:
    """One token per word of every turn, plus two for the generation prompt."""

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, return_dict=False, **_):
        ids = list(range(sum(len(m["content"].split()) for m in messages) + 2))
        return {"input_ids": ids} if return_dict else ids  # the safe-prompt encoder asks for a dict


def test_rows_that_do_not_fit_the_context_are_left_out_with_one_warning(tmp_path):
    worker = Evaluator(tmp_path)
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=40))
    rows = [Sample(0, [{"role": "user", "content": "short question"}], "a"),
            Sample(1, [{"role": "user", "content": "word " * 30}], "b"),  # 32 + 16 new tokens > 40
            Sample(2, [{"role": "user", "content": "word " * 22}], "c")]  # 24 + 16 = 40: fits exactly
    kept = worker.fitting(rows, model, WordTokenizer(), EvalSpec(max_new_tokens=16))
    worker.events.close()

    assert [s.index for s in kept] == [0, 2]
    events, _ = ev.read_new(tmp_path / ev.LOG_NAME, 0)
    warnings = [e.message for e in events if e.kind == "warning"]
    assert warnings == ["Left out 1 of 3 test row(s) whose prompt and max_new_tokens (16) do not fit the model's "
                        "context of 40 tokens: shorten those rows or lower max_new_tokens"]
