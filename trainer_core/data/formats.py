"""Dataset layouts: the column mapping, format detection and the converters to the trainer's shape.

Works on rows already read (``readers``); the New run page's column pickers use the same functions
(``columns_of``, ``turn_values``, ``ROLE_ALIASES``) so the form and the trainer never disagree on what
a chat column is.

Kept whole: format detection and the converters share the column mapping and role aliases, and the New run page's
pickers use the same functions, so the form and the trainer cannot disagree.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from trainer_core.config import FORMAT_TYPES
from trainer_core.data import DatasetError, quoted, tool_formats

REQUIRED_COLUMNS = {
    "alpaca": ("instruction", "output"),
    "chatml": ("messages",),
    "sharegpt": ("conversations",),
    "xlam": ("query", "answers"),
    "text": ("text",),
}
FORMAT_NEEDS = {
    "alpaca": "'instruction' and 'output' columns (and optionally 'input')",
    "chatml": "a 'messages' column holding a list of {role, content} turns",
    "sharegpt": "a 'conversations' column holding a list of {from, value} turns",
    "xlam": "'query', 'answers' (the tool calls) and 'tools' columns",
    "text": "a 'text' column of raw text",
}
ROLE_ALIASES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant"}
COLUMN_KEYS = ("instruction", "input", "output", "messages", "conversations", "text")
TURN_KEYS = ("role", "content", "from", "value")
MAPPING_KEYS = COLUMN_KEYS + TURN_KEYS + tuple(ROLE_ALIASES)

_DETECT_SAMPLE = 100  # rows inspected to tell role/content turns from from/value turns


@dataclass
class NormalizedData:
    """Rows in the trainer's shape, plus what was detected and what was dropped (reason -> count)."""

    format: str
    reason: str
    rows: list[dict]
    dropped: dict[str, int] = field(default_factory=dict)
    drop_examples: dict[str, list[str]] = field(default_factory=dict)  # reason -> a few distinct examples

    def drop_warning(self, what: str = "training rows") -> str | None:
        """All drops in ONE message (reason, count, a few examples): thousands of rows with made-up roles
        must not become thousands of warnings."""
        if not self.dropped:
            return None
        total = sum(self.dropped.values())
        parts = []
        for reason, count in sorted(self.dropped.items(), key=lambda item: (-item[1], item[0])):
            examples = self.drop_examples.get(reason, [])
            parts.append(f"{reason}: {count:,}" + (f" (e.g. {', '.join(examples)})" if examples else ""))
        return f"Dropped {total:,} of {total + len(self.rows):,} {what}: " + "; ".join(parts)

    @property
    def is_chat(self) -> bool:
        return self.format != "text"

    def summary(self) -> str:
        text = f"{len(self.rows)} rows, {self.format} ({self.reason})"
        if self.dropped:
            details = ", ".join(f"{reason}: {count}" for reason, count in sorted(self.dropped.items()))
            text += f"; dropped {sum(self.dropped.values())} ({details})"
        return text


# ---------------------------------------------------------------------- mapping
@dataclass(frozen=True)
class _Mapping:
    """custom_format_mapping split into column renames, turn-key renames and role-name aliases."""

    columns: dict[str, str]
    turn: dict[str, str]
    roles: dict[str, str]

    def col(self, name: str) -> str:
        return self.columns.get(name, name)

    @classmethod
    def parse(cls, mapping: dict[str, str] | None) -> "_Mapping":
        mapping = dict(mapping or {})
        unknown = [key for key in mapping if key not in MAPPING_KEYS]
        if unknown:
            raise DatasetError("custom_format_mapping", f"unknown name {quoted(unknown)}: map one of "
                                                        f"{', '.join(MAPPING_KEYS)} onto your column names")
        empty = [key for key, value in mapping.items() if not isinstance(value, str) or not value.strip()]
        if empty:
            raise DatasetError("custom_format_mapping", f"{quoted(empty)} maps to nothing: name one of your columns")
        roles = dict(ROLE_ALIASES)
        roles.update({mapping[key].strip().lower(): ROLE_ALIASES[key] for key in ROLE_ALIASES if key in mapping})
        return cls(columns={k: v for k, v in mapping.items() if k in COLUMN_KEYS},
                   turn={k: v for k, v in mapping.items() if k in TURN_KEYS},
                   roles=roles)


# ---------------------------------------------------------------------- detection
def detect_format(rows: list[dict]) -> tuple[str, str]:
    """(format, reason): which layout the rows are in, and a sentence saying why."""
    return _detect(rows, _Mapping.parse(None), columns_of(rows))


def _detect(rows: list[dict], m: _Mapping, columns: list[str]) -> tuple[str, str]:
    def found(name: str) -> str:
        column = m.col(name)
        return f"'{column}' (mapped to '{name}')" if column != name else f"'{name}'"

    for fmt, name in (("chatml", "messages"), ("sharegpt", "conversations")):
        if m.col(name) in columns:
            shape = _turn_shape(rows, m.col(name), m)
            if shape:
                return fmt, f"found a {found(name)} column with {shape} turns"
    if "query" in columns and "answers" in columns:
        return "xlam", "found 'query', 'answers' and 'tools' columns (tool calls, xLAM layout)"
    if m.col("instruction") in columns and m.col("output") in columns:
        names = ["instruction", "input", "output"] if m.col("input") in columns else ["instruction", "output"]
        listed = ", ".join(found(n) for n in names[:-1]) + f" and {found(names[-1])}"
        return "alpaca", f"found {listed} columns"
    if m.col("text") in columns:
        return "text", f"found a {found('text')} column of raw text"
    needs = "; ".join(f"{fmt} needs {what}" for fmt, what in FORMAT_NEEDS.items())
    other = _other_method_hint(columns)
    raise DatasetError("format_type", f"could not tell the format: the columns are {quoted(columns)}. {needs}. "
                                      "Rename your columns, or map them with custom_format_mapping "
                                      "(e.g. {instruction: question, output: answer})." + other)


# Columns that say the file was made for another kind of training than chat/text: the fix is the method.
_OTHER_METHODS = ((("prompt", "chosen", "rejected"), "preference pairs: train them with method dpo, orpo, simpo, "
                                                     "kto or reward"),
                  (("prompt", "completion", "label"), "labelled answers: train them with method kto"),
                  (("anchor", "positive"), "embedding pairs: train them with method embedding"))


def _other_method_hint(columns: list[str]) -> str:
    for needed, what in _OTHER_METHODS:
        if set(needed) <= set(columns):
            return f" These columns look like {what}."
    return ""


def _turn_shape(rows: list[dict], column: str, m: _Mapping) -> str | None:
    """'role/content' or 'from/value' when the column holds lists of turns; None when it does not."""
    saw_list = False
    for index, row in enumerate(rows):
        if saw_list and index >= _DETECT_SAMPLE:
            break
        turns = as_turn_list(row.get(column))
        if turns is None:
            continue
        saw_list = True
        if not turns:
            continue
        first = turns[0]
        if isinstance(first, dict):
            if m.turn.get("role", "role") in first or m.turn.get("content", "content") in first:
                return "role/content"
            if m.turn.get("from", "from") in first or m.turn.get("value", "value") in first:
                return "from/value"
        return None  # turns of an unknown shape: not a chat column
    if not saw_list:
        return None
    return "from/value" if column == "conversations" else "role/content"  # only empty lists: assume the usual shape


def as_turn_list(value: Any) -> list | None:
    """A chat column's value as a list of turns (also when stored as JSON text, as in CSV); None otherwise."""
    if isinstance(value, str) and value.lstrip().startswith("["):  # chat turns stored as JSON text (CSV)
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):  # RecursionError: nested deeper than Python parses
            return None
    return value if isinstance(value, list) else None


def columns_of(rows: list[dict]) -> list[str]:
    """Every column name of the rows, in order of first appearance."""
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    return [str(c) for c in seen]


def turn_values(rows: list[dict], column: str, key: str | None = None, limit: int = 50) -> list[str]:
    """The keys of the turns in a chat column, or (with ``key``) the distinct text values under that key:
    what the form's role pickers offer. At most ``limit`` of them, in order of first appearance."""
    found: dict[str, None] = {}
    for row in rows:
        for turn in as_turn_list(row.get(column)) or []:
            if not isinstance(turn, dict):
                continue
            if key is None:
                found.update(dict.fromkeys(str(k) for k in turn))
            elif isinstance(turn.get(key), str):
                found[turn[key]] = None
    return list(found)[:limit]


def unknown_speakers(names: list[str]) -> list[str]:
    """The speaker names no format knows (``ROLE_ALIASES``): each must be mapped to user, assistant or system."""
    return [name for name in names if name.strip().lower() not in ROLE_ALIASES]


# ---------------------------------------------------------------------- normalisation
def normalize_rows(rows: list[dict], format_type: str, mapping: dict[str, str] | None = None,
                   system_prompt: str = "", field_name: str = "local_datasets") -> NormalizedData:
    """Rows in the trainer's shape. Unusable rows are dropped and counted; none usable is an error."""
    data = convert_rows(rows, format_type, mapping, system_prompt)
    if not data.rows:
        raise no_usable_rows(field_name, len(rows), data.dropped)
    return data


def convert_rows(rows: list[dict], format_type: str, mapping: dict[str, str] | None,
                 system_prompt: str) -> NormalizedData:
    """Like ``normalize_rows``, but an empty result is returned (merged files decide together)."""
    if format_type not in FORMAT_TYPES:
        raise DatasetError("format_type", f"unknown format '{format_type}': choose one of {', '.join(FORMAT_TYPES)}")
    m = _Mapping.parse(mapping)
    columns = columns_of(rows)
    if format_type == "auto":
        try:
            fmt, reason = _detect(rows, m, columns)
        except DatasetError:
            _require_mapped_columns(m, columns)  # a mapping to a missing column is the likelier mistake
            raise
    else:
        fmt, reason = format_type, f"format_type is set to '{format_type}'"
        _require_columns(rows, fmt, m, columns)
    convert = _CONVERTERS[fmt]
    system = system_prompt.strip()
    out: list[dict] = []
    dropped: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    for row in rows:
        value, problem = convert(row, m)
        if problem:
            why, example = problem if isinstance(problem, tuple) else (problem, None)
            dropped[why] += 1
            shown = examples.setdefault(why, [])
            if example is not None and len(shown) < MAX_DROP_EXAMPLES and example not in shown:
                shown.append(example)
        elif fmt == "text":
            out.append({"text": value})
        else:
            shaped = value if isinstance(value, dict) else {"messages": value}  # a tool row carries its tools
            if system and shaped["messages"][0]["role"] != "system":
                shaped["messages"].insert(0, {"role": "system", "content": system})
            out.append(shaped)
    return NormalizedData(format=fmt, reason=reason, rows=out, dropped=dict(dropped),
                          drop_examples={k: v for k, v in examples.items() if v})


def _require_columns(rows: list[dict], fmt: str, m: _Mapping, columns: list[str]) -> None:
    """Columns a format needs must exist in at least one row; say which are missing and how to fix it."""
    missing = [name for name in REQUIRED_COLUMNS[fmt] if m.col(name) not in columns]
    if not missing:
        return
    _require_mapped_columns(m, columns, only=missing)
    try:
        other, why = _detect(rows, m, columns)
        hint = f" This looks like {other} data ({why}): set format_type to '{other}' or 'auto'."
    except DatasetError:
        hint = (f" Rename your columns, or map them with custom_format_mapping "
                f"(e.g. {{{missing[0]}: <your column>}}).")
    verb = "is" if len(missing) == 1 else "are"
    raise DatasetError("format_type", f"format '{fmt}' needs {FORMAT_NEEDS[fmt]}, but {quoted(missing)} {verb} "
                                      f"missing; the columns are {quoted(columns)}.{hint}")


def _require_mapped_columns(m: _Mapping, columns: list[str], only: list[str] | None = None) -> None:
    names = only if only is not None else list(m.columns)
    mapped = [name for name in names if name in m.columns and m.col(name) not in columns]
    if mapped:
        maps = ", ".join(f"{name} to '{m.col(name)}'" for name in mapped)
        raise DatasetError("custom_format_mapping", f"maps {maps}, but the data has no such column; the columns are "
                                                    f"{quoted(columns)}. Map to one of these columns.")


def _text_value(value: Any) -> tuple[str | None, str | None]:
    """(text, None) or (None, 'missing' | 'not text'). Numbers count as text: CSV-free sources keep them typed."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None, "missing"
    if isinstance(value, bool):
        return None, "not text"
    if isinstance(value, (int, float)):
        return str(value), None
    if isinstance(value, str):
        return (value, None) if value.strip() else (None, "missing")
    return None, "not text"


def _field_problem(name: str, problem: str) -> str:
    return f"missing {name}" if problem == "missing" else f"{name} is not text"


def _alpaca(row: dict, m: _Mapping) -> tuple[Any, str | None]:
    instruction, problem = _text_value(row.get(m.col("instruction")))
    if problem:
        return None, _field_problem("instruction", problem)
    output, problem = _text_value(row.get(m.col("output")))
    if problem:
        return None, _field_problem("output", problem)
    extra, problem = _text_value(row.get(m.col("input")))
    if problem == "not text":
        return None, _field_problem("input", problem)
    user = f"{instruction}\n\n{extra}" if extra else instruction
    return [{"role": "user", "content": user}, {"role": "assistant", "content": output}], None


def _chat(column: str):
    def convert(row: dict, m: _Mapping) -> tuple[Any, str | tuple[str, str] | None]:
        raw = row.get(m.col(column))
        if raw is None:
            return None, f"missing {column}"
        turns = as_turn_list(raw)
        if turns is None:
            return None, f"{column} is not a list of turns"
        role_keys = (m.turn.get("role", "role"), m.turn.get("from", "from"))
        content_keys = (m.turn.get("content", "content"), m.turn.get("value", "value"))
        if tool_formats.tool_row_wanted(row, turns):  # calls, results or a tools list: read by data.tool_formats
            return tool_formats.read_conversation(row, turns, m.roles, role_keys, content_keys, UNSUPPORTED_ROLE)
        messages = []
        for turn in turns:
            if not isinstance(turn, dict):
                return None, "malformed turn"
            role_key = next((k for k in role_keys if k in turn), None)
            content_key = next((k for k in content_keys if k in turn), None)
            if role_key is None or content_key is None or not isinstance(turn[role_key], str):
                return None, "malformed turn"
            role = m.roles.get(turn[role_key].strip().lower())
            if role is None:  # one reason for every unknown role; the role itself is kept as an example
                return None, (UNSUPPORTED_ROLE, repr(turn[role_key][:40]))
            content, problem = _text_value(turn[content_key])
            if problem == "not text":
                return None, "malformed turn"
            if content is not None:  # an empty turn teaches nothing; keep the rest of the conversation
                messages.append({"role": role, "content": content})
        if not messages:
            return None, "empty conversation"
        roles = {message["role"] for message in messages}
        if "assistant" not in roles:
            return None, "no assistant turn"
        if "user" not in roles:
            return None, "no user turn"
        return messages, None

    return convert


def _text(row: dict, m: _Mapping) -> tuple[Any, str | None]:
    text, problem = _text_value(row.get(m.col("text")))
    return (None, _field_problem("text", problem)) if problem else (text, None)


UNSUPPORTED_ROLE = "unsupported role (map it in custom_format_mapping, e.g. {bot: assistant})"
MAX_DROP_EXAMPLES = 3

_CONVERTERS = {"alpaca": _alpaca, "chatml": _chat("messages"), "sharegpt": _chat("conversations"),
               "xlam": lambda row, m: tool_formats.read_xlam(row), "text": _text}


def no_usable_rows(field_name: str, total: int, dropped: dict[str, int]) -> DatasetError:
    details = ", ".join(f"{reason}: {count}" for reason, count in sorted(dropped.items()))
    return DatasetError(field_name, f"no usable rows: all {total} rows were dropped ({details or 'no rows'}). "
                                    "Check the format and column mapping.")
