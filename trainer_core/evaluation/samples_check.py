"""Is a sample answer degenerate? Pure checks on text (no torch): the worker runs them on each greedy
sample it takes during training, and the pump turns the findings into alerts (``jobs/alerts.py``).

* ``empty``: nothing but whitespace once the stop token is cut off.
* ``repetition``: one unit (a run of words and punctuation, or of characters for text without spaces)
  repeated back to back at least ``MIN_REPEATS`` times, covering at least ``LOOP_COVERAGE`` of the answer.
  Repeated *phrases* with different words between them ("Paris is the capital of France. Berlin is the
  capital of Germany.") are not a loop; only exact consecutive repeats are.
* ``template_leak``: a chat-template or special token inside the answer (``<|im_end|>``, ``[INST]``, ``</s>``,
  ...), from a fixed list plus the tokenizer's own special tokens: the model has not learned where its
  turn ends. The worker cuts the one stop token that ended generation off before checking.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

EMPTY = "empty"
REPETITION = "repetition"
TEMPLATE_LEAK = "template_leak"
KINDS = (EMPTY, REPETITION, TEMPLATE_LEAK)

MIN_REPEATS = 3
LOOP_COVERAGE = 0.5
MAX_UNIT_WORDS = 40  # longest repeated unit looked for, in words and punctuation marks
MAX_UNIT_CHARS = 64  # ... in characters (text without spaces: CJK, "!!!!", "hahaha")
CHECKED_CHARS = 8_000  # longer answers are checked on their first 8,000 characters
MIN_SPECIAL_LEN = 3  # a tokenizer's special token shorter than this ("a", "\n") is ordinary text
# Turn markers of the common chat templates (ChatML, Llama 2/3, Mistral, Gemma, Phi-3, Zephyr) and the usual
# begin/end-of-sequence tokens.
TEMPLATE_TOKENS = (
    "<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|begin_of_text|>",
    "<|end_of_text|>", "<|endoftext|>", "</s>", "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>", "<start_of_turn>",
    "<end_of_turn>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>",
)

_WORDS = re.compile(r"\w+|[^\w\s]")


def check(text: str, special_tokens: Iterable[str] = ()) -> dict[str, str]:
    """{kind: what was found} for each degeneration in ``text``; empty when the answer looks healthy."""
    if not text.strip():
        return {EMPTY: "the answer is empty"}
    found: dict[str, str] = {}
    loop = repetition(text[:CHECKED_CHARS])
    if loop:
        found[REPETITION] = loop
    leaked = leaked_tokens(text, special_tokens)
    if leaked:
        found[TEMPLATE_LEAK] = "the answer contains " + ", ".join(leaked[:5])
    return found


def leaked_tokens(text: str, special_tokens: Iterable[str] = ()) -> list[str]:
    """The template and special tokens found in ``text``, in the order of the lists."""
    tokens = dict.fromkeys([*TEMPLATE_TOKENS, *(t for t in special_tokens if isinstance(t, str)
                                                 and len(t.strip()) >= MIN_SPECIAL_LEN)])
    return [token for token in tokens if token in text]


def repetition(text: str) -> str:
    """What loops in ``text`` ("'I am a bot.' repeated 12 times, 96% of the answer"), or ""."""
    matches = list(_WORDS.finditer(text))
    words = [m.group() for m in matches]
    found = _tandem(words, MAX_UNIT_WORDS)
    if found:
        start, unit, repeats, covered = found
        shown = text[matches[start].start():matches[start + len(unit) - 1].end()]  # the unit as written
        return _describe(shown, repeats, covered / len(words))
    chars = re.sub(r"\s+", " ", text.strip())
    found = _tandem(chars, MAX_UNIT_CHARS)
    if found:
        _, unit, repeats, covered = found
        return _describe("".join(unit), repeats, covered / len(chars))
    return ""


def _describe(unit: str, repeats: int, share: float) -> str:
    shown = unit if len(unit) <= 40 else unit[:39] + "…"
    return f"{shown!r} repeated {repeats} times, {share:.0%} of the answer"


def _tandem(items: Sequence, max_unit: int) -> tuple[int, Sequence, int, int] | None:
    """The longest span of ``items`` made of one unit repeated back to back (start, unit, repeats, items covered),
    when it repeats at least MIN_REPEATS times and covers LOOP_COVERAGE of the items; None otherwise.

    For each unit length p, a run of positions where items[i] == items[i + p] is a span of period p."""
    n = len(items)
    best: tuple[int, Sequence, int, int] | None = None
    for p in range(1, min(max_unit, n // MIN_REPEATS) + 1):
        run = 0
        for i in range(n - p):
            if items[i] == items[i + p]:
                run += 1
                continue
            best = _better(best, items, i - run, run + p, p)
            run = 0
        best = _better(best, items, n - p - run, run + p, p)
    if best is None or best[3] < LOOP_COVERAGE * n:
        return None
    return best


def _better(best, items: Sequence, start: int, span: int, p: int):
    repeats = span // p
    if repeats < MIN_REPEATS:
        return best
    covered = repeats * p
    if best is not None and covered <= best[3]:
        return best
    return start, items[start:start + p], repeats, covered
