"""A generated record -> a training row, by the recipe's ``output`` template.

``output`` is the row's shape with Jinja expressions in its strings: ``{"messages": [{"role": "user", "content":
"{{ qa.question }}"}, {"role": "assistant", "content": "{{ qa.answer }}"}]}``. A string that is one expression and
nothing else keeps the value's type (a list of tools stays a list); any other string is rendered as text. The
templates run in Jinja's sandbox: a recipe is user input, and its expressions reach no Python attribute beyond the
record's values. Dashboard-safe (jinja2 only).
"""
from __future__ import annotations

import json
import re
from typing import Any

from jinja2 import StrictUndefined, TemplateError, UndefinedError
from jinja2.sandbox import SandboxedEnvironment

WHOLE = re.compile(r"^\s*\{\{\s*([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*|\[\d+\])*)\s*\}\}\s*$")
NAME = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)")
MAX_DEPTH = 8
PROVENANCE = "provenance"  # the row's source file, page and chunk, kept with a row made from documents

_env = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)


class RowError(ValueError):
    """A record the template cannot fill (a missing column or key); the message names the field."""


def template_problems(template: Any, columns: list[str]) -> list[tuple[str, str]]:
    """(where, problem) for each part of ``template`` that cannot work: not a JSON shape, a string that is not a
    Jinja template, or a name that is none of the record's columns ("*" in ``columns``: any name may be a seed
    column). ``where`` is relative to ``output`` ("", "[messages][0].content")."""
    if not isinstance(template, dict) or not template:
        return [("", "the training row to write: an object such as {messages: [{role: user, content: "
                     "'{{ qa.question }}'}, {role: assistant, content: '{{ qa.answer }}'}]}")]
    problems: list[tuple[str, str]] = []
    _check(template, "", columns, problems, 0)
    return problems[:10]


def _check(value: Any, where: str, columns: list[str], problems: list, depth: int) -> None:
    if depth > MAX_DEPTH:
        problems.append((where, f"nested deeper than {MAX_DEPTH} levels"))
    elif isinstance(value, dict):
        for key, part in value.items():
            _check(part, f"{where}.{key}", columns, problems, depth + 1)
    elif isinstance(value, list):
        for i, part in enumerate(value):
            _check(part, f"{where}[{i}]", columns, problems, depth + 1)
    elif isinstance(value, str):
        try:
            _env.parse(value)
        except TemplateError as exc:
            problems.append((where, f"not a Jinja template: {exc}"))
            return
        unknown = [n for n in NAME.findall(value) if n not in columns and "*" not in columns]
        if unknown:
            problems.append((where, f"{unknown[0]!r} is none of the recipe's columns ({', '.join(columns)})"))
    elif not (value is None or isinstance(value, (int, float, bool))):
        problems.append((where, "JSON values only"))


def render(template: Any, record: dict) -> Any:
    """``template`` filled from ``record`` (its columns; a structured column's keys by dot). RowError names the
    part that cannot be filled."""
    return _render(template, _values(record), "output")


def _values(record: dict) -> dict:
    """JSON text in a column (a structured answer stored as text) is read as its value, so ``{{ qa.answer }}`` works
    whichever way Data Designer kept it."""
    out = {}
    for key, value in record.items():
        if isinstance(value, str) and value[:1] in "{[":
            try:
                value = json.loads(value)
            except ValueError:
                pass
        out[key] = value
    return out


def _render(value: Any, values: dict, where: str) -> Any:
    if isinstance(value, dict):
        return {key: _render(part, values, f"{where}.{key}") for key, part in value.items()}
    if isinstance(value, list):
        return [_render(part, values, f"{where}[{i}]") for i, part in enumerate(value)]
    if not isinstance(value, str) or "{" not in value:
        return value
    try:
        if WHOLE.match(value):
            return _env.compile_expression(WHOLE.match(value).group(1), undefined_to_none=False)(**values)
        return _env.from_string(value).render(**values)
    except UndefinedError as exc:
        raise RowError(f"{where}: {exc.message}") from None
    except (TemplateError, TypeError, ValueError) as exc:
        raise RowError(f"{where}: {exc}") from None


def texts(row: Any, fields: list[str] | None = None) -> str:
    """The row's text, for duplicate detection: the chosen top-level fields (all when empty), every string in them."""
    parts: list[str] = []
    chosen = {k: v for k, v in row.items() if not fields or k in fields} if isinstance(row, dict) else row
    _strings(chosen, parts)
    return "\n".join(parts)


def _strings(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for key, part in value.items():
            if key not in ("role", PROVENANCE, "type", "id"):
                _strings(part, out)
    elif isinstance(value, list):
        for part in value:
            _strings(part, out)


def lookup(row: dict, column: str) -> tuple[bool, Any]:
    """(found, value) of ``column`` in ``row``; ``qa.answer`` is key ``answer`` of the structured column ``qa`` (kept
    as an object or as its JSON text)."""
    if column in row:
        return True, row[column]
    head, _, rest = column.partition(".")
    if not rest or head not in row:
        return False, None
    value = row[head]
    for key in rest.split("."):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return False, None
        if not isinstance(value, dict) or key not in value:
            return False, None
        value = value[key]
    return True, value
