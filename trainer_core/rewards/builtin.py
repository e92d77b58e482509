"""Built-in GRPO rewards: pure Python, no ML imports, safe to run in the dashboard's reward check.

Every reward is called the way TRL's GRPOTrainer calls a reward function,
``fn(prompts, completions, **columns) -> list[float | None]``, with ``completions`` either strings or
conversational completions (a list of ``{"role", "content"}`` messages; with grpo.tools, the assistant's turns with
their calls and the tools' results, which the built-ins leave out: they score the model's own words). The parameters of each are the
keyword-only arguments after ``completions``; ``PARAMS`` documents them for the config reference and the form.

User patterns (``format``'s pattern, a ``json_valid`` schema's ``pattern``, ``patternProperties`` and
``propertyNames``) run on the ``regex`` module with a time limit: ``re`` has none, and a pattern such as
``(a|aa)+b`` backtracks for hours on a long completion, in the reward check and in every training step.
"""
from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from typing import Any, Callable

import regex

THINK_ANSWER = r"\s*<think>.+?</think>\s*<answer>.+?</answer>\s*"
FORMAT_PRESETS = {"think_answer": THINK_ANSWER}
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
PATTERN_TIMEOUT_S = 1.0  # per match: a sane pattern takes microseconds on a completion


class PatternTimeout(TimeoutError):
    """A user's pattern ran past PATTERN_TIMEOUT_S on one string; the message says why and how to rewrite it."""


def _timed(pattern: Any, text: str, how: str = "search") -> Any:
    """``pattern.search`` (or fullmatch) of ``text`` within PATTERN_TIMEOUT_S; PatternTimeout past it."""
    compiled = pattern if isinstance(pattern, regex.Pattern) else regex.compile(pattern)
    try:
        return getattr(compiled, how)(text, timeout=PATTERN_TIMEOUT_S)
    except TimeoutError:
        raise PatternTimeout(
            f"the pattern {compiled.pattern!r} took longer than {PATTERN_TIMEOUT_S:g} s on a completion of "
            f"{len(text):,} characters: it backtracks without end (a repeat inside a repeat, such as (a|aa)+ or "
            "(a+)+); rewrite it so that each character can match in one way only") from None


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, or the content of a conversational completion's messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    if isinstance(completion, (list, tuple)):
        return "".join(completion_text(part) for part in completion)
    return "" if completion is None else str(completion)


def _texts(completions: list) -> list[str]:
    """What the model wrote in each completion: in a GRPO rollout with tools, its turns without the tools' results
    (those are the tools' words, not the model's; a reward of your own sees them in ``completions``)."""
    return [completion_text([m for m in c if not (isinstance(m, dict) and m.get("role") == "tool")]
                            if isinstance(c, list) else c) for c in completions]


def length(prompts: list, completions: list, *, target: int = 20, unit: str = "words", tolerance: int = 0,
           **_: Any) -> list[float]:
    """0 within ``tolerance`` of ``target`` words (or characters), falling by 1 per ``target`` units away:
    -1.0 for a completion twice too long or empty."""
    scale = max(1, target)
    out = []
    for text in _texts(completions):
        size = len(text.split()) if unit == "words" else len(text)
        out.append(-max(0, abs(size - target) - tolerance) / scale)
    return out


def format_match(prompts: list, completions: list, *, pattern: str = "", preset: str = "", **_: Any) -> list[float]:
    """1.0 when the whole completion matches the regex (``preset: think_answer`` for
    ``<think>...</think><answer>...</answer>``), else 0.0."""
    compiled = regex.compile(pattern or FORMAT_PRESETS[preset or "think_answer"], regex.DOTALL)
    return [1.0 if _timed(compiled, text, "fullmatch") else 0.0 for text in _texts(completions)]


def _normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    text = re.sub(r"[^\w\s]", " ", text)
    return " ".join(text.split())


def _number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def extract_answer(text: str, extract: str = "tag", tag: str = "answer") -> str | None:
    """The answer part of a completion: inside ``<tag>...</tag>`` (the last such block), the last number,
    or the whole text."""
    if extract == "tag":
        blocks = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, re.DOTALL)
        return blocks[-1].strip() if blocks else None
    if extract == "last_number":
        found = _NUMBER.findall(text)
        return found[-1] if found else None
    return text.strip()


def answer_match(prompts: list, completions: list, *, column: str = "answer", mode: str = "normalized",
                 extract: str = "tag", tag: str = "answer", **columns: Any) -> list[float | None]:
    """1.0 when the extracted answer equals the row's ``column`` (exact, normalized: case, punctuation and
    spacing ignored, or numeric: 1,000 == 1000.0), 0.0 otherwise; None for a row without a reference."""
    references = columns.get(column)
    if references is None:
        raise KeyError(f"answer_match needs a '{column}' column in the dataset (set column: to the one holding "
                       "the reference answers)")
    out: list[float | None] = []
    for text, reference in zip(_texts(completions), references):
        if reference is None:
            out.append(None)
            continue
        reference = str(reference)
        if mode == "numeric":  # GSM8K writes '#### 72' after its reasoning: the last number is the answer
            reference = str(_number(reference)) if _number(reference) is not None else reference
        answer = extract_answer(text, extract, tag)
        if answer is None:
            out.append(0.0)
        elif mode == "exact":
            out.append(1.0 if answer == reference.strip() else 0.0)
        elif mode == "numeric":
            got, want = _number(answer), _number(reference)
            out.append(1.0 if got is not None and want is not None and abs(got - want) <= 1e-6 * max(1, abs(want))
                       else 0.0)
        else:
            out.append(1.0 if _normalise(answer) == _normalise(reference) else 0.0)
    return out


def _json_part(text: str) -> str:
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    return (fenced.group(1) if fenced else text).strip()


def json_valid(prompts: list, completions: list, *, schema: dict | None = None, **_: Any) -> list[float]:
    """1.0 when the completion (or its first fenced block) parses as JSON and, with ``schema``, validates
    against that JSON schema; else 0.0."""
    validator = schema_validator(schema) if schema else None
    out = []
    for text in _texts(completions):
        try:
            value = json.loads(_json_part(text))
            out.append(1.0 if validator is None or validator.is_valid(value) else 0.0)
        except (ValueError, RecursionError):  # not JSON, or nested too deep to parse or to validate
            out.append(0.0)
    return out


def schema_validator(schema: dict):
    """A JSON-schema (2020-12) validator whose patterns run with the time limit. jsonschema matches with ``re``
    in ``pattern``, ``patternProperties`` and ``additionalProperties`` (which patterns exempt), replaced here;
    ``unevaluatedProperties`` with ``patternProperties`` is refused when the reward is validated (spec.py)."""
    import jsonschema  # altair's own dependency: always installed with the dashboard
    from jsonschema.exceptions import ValidationError

    def pattern(validator, patrn, instance, schema):
        if validator.is_type(instance, "string") and not _timed(patrn, instance):
            yield ValidationError(f"{instance!r} does not match {patrn!r}")

    def pattern_properties(validator, patterns, instance, schema):
        if validator.is_type(instance, "object"):
            for patrn, subschema in patterns.items():
                for key, value in instance.items():
                    if _timed(patrn, key):
                        yield from validator.descend(value, subschema, path=key, schema_path=patrn)

    def additional_properties(validator, allowed, instance, schema):
        if not validator.is_type(instance, "object"):
            return
        patterns = list(schema.get("patternProperties", {}))
        extras = sorted((key for key in instance if key not in schema.get("properties", {})
                         and not any(_timed(patrn, key) for patrn in patterns)), key=str)
        if validator.is_type(allowed, "object"):
            for extra in extras:
                yield from validator.descend(instance[extra], allowed, path=extra)
        elif not allowed and extras:
            yield ValidationError(f"Additional properties are not allowed ({', '.join(map(repr, extras))} unexpected)")

    return jsonschema.validators.extend(jsonschema.Draft202012Validator, {
        "pattern": pattern, "patternProperties": pattern_properties,
        "additionalProperties": additional_properties})(schema)


def _keyword_fraction(text: str, keywords: list[str], case_sensitive: bool) -> float:
    if not keywords:
        return 0.0
    hay = text if case_sensitive else text.casefold()
    found = sum(1 for word in keywords if (word if case_sensitive else word.casefold()) in hay)
    return found / len(keywords)


def contains(prompts: list, completions: list, *, keywords: list[str] = (), case_sensitive: bool = False,
             **_: Any) -> list[float]:
    """The fraction of ``keywords`` the completion contains (1.0: all of them)."""
    return [_keyword_fraction(t, list(keywords), case_sensitive) for t in _texts(completions)]


def not_contains(prompts: list, completions: list, *, keywords: list[str] = (), case_sensitive: bool = False,
                 **_: Any) -> list[float]:
    """Minus the fraction of ``keywords`` the completion contains (0.0: none of them)."""
    return [-_keyword_fraction(t, list(keywords), case_sensitive) for t in _texts(completions)]


def no_repetition(prompts: list, completions: list, *, ngram: int = 3, **_: Any) -> list[float]:
    """Minus the share of repeated word n-grams (0.0: no n-gram occurs twice; near -1.0: a loop)."""
    out = []
    for text in _texts(completions):
        words = text.split()
        grams = [tuple(words[i:i + ngram]) for i in range(max(0, len(words) - ngram + 1))]
        if not grams:
            out.append(0.0)
            continue
        repeated = sum(count - 1 for count in Counter(grams).values())
        out.append(-repeated / len(grams))
    return out


BUILTINS: dict[str, Callable[..., list]] = {
    "length": length, "format": format_match, "answer_match": answer_match, "json_valid": json_valid,
    "contains": contains, "not_contains": not_contains, "no_repetition": no_repetition,
}

# name -> {parameter: (type, default, help)}: the config reference, the form and validation read this table.
PARAMS: dict[str, dict[str, tuple[type | tuple, Any, str]]] = {
    "length": {"target": (int, 20, "the completion length aimed at"),
               "unit": (str, "words", "words or chars"),
               "tolerance": (int, 0, "how far from target still scores 0 (the best)")},
    "format": {"pattern": (str, "", "a regex the whole completion must match"),
               "preset": (str, "", "think_answer: <think>...</think><answer>...</answer>")},
    "answer_match": {"column": (str, "answer", "the dataset column holding the reference answer"),
                     "mode": (str, "normalized", "exact, normalized or numeric"),
                     "extract": (str, "tag", "tag (<answer>...</answer>), last_number or whole"),
                     "tag": (str, "answer", "the tag the answer is written in")},
    "json_valid": {"schema": (dict, None, "an optional JSON schema the value must validate against")},
    "contains": {"keywords": (list, [], "words or phrases to include"),
                 "case_sensitive": (bool, False, "match case")},
    "not_contains": {"keywords": (list, [], "words or phrases to avoid"),
                     "case_sensitive": (bool, False, "match case")},
    "no_repetition": {"ngram": (int, 3, "the n-gram size counted")},
}
CHOICES = {("length", "unit"): ("words", "chars"), ("format", "preset"): ("",) + tuple(FORMAT_PRESETS),
           ("answer_match", "mode"): ("exact", "normalized", "numeric"),
           ("answer_match", "extract"): ("tag", "last_number", "whole")}
