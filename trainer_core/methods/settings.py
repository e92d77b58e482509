"""A method's own settings: a small documented dataclass read from the YAML section named after the method
(``dpo: {beta: 0.1}``), every problem collected with its field (``dpo.beta``) and the fix.

Each field carries its help text, and its bounds or choices, in ``setting(...)``: the parser, the form and
the config reference read the same metadata, as TrainConfig's fields do.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import field, fields
from typing import Any, get_type_hints

from trainer_core.protocol.errors import FieldError


def setting(default: Any, help: str, *, low: float | None = None, high: float | None = None,
            choices: tuple | None = None, low_open: bool = False) -> Any:
    meta = {"help": help, "low": low, "high": high, "choices": choices, "low_open": low_open}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


def _type_ok(expected: Any, value: Any) -> bool:
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected in (list, dict, str, bool):
        return isinstance(value, expected)
    return True


def _kind(expected: Any) -> str:
    return {float: "a number", int: "a whole number", bool: "true or false", str: "text", list: "a list",
            dict: "a mapping"}.get(expected, str(expected))


def parse_settings(cls: type, raw: Any, where: str) -> tuple[Any, list[FieldError]]:
    """(settings, problems): ``raw`` (a mapping, or None for the defaults) read into ``cls``."""
    if raw is None:
        return cls(), []
    if dataclasses.is_dataclass(raw):
        raw = dataclasses.asdict(raw)
    if not isinstance(raw, dict):
        return cls(), [FieldError(where, f"must be a mapping of settings, e.g. {where}: {{{fields(cls)[0].name}: ...}}")]
    hints = get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    values, problems = {}, []
    for key, value in raw.items():
        at = f"{where}.{key}"
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f"; it takes {', '.join(known)}"
            problems.append(FieldError(at, f"unknown setting '{key}'{hint}"))
            continue
        meta = known[key].metadata
        expected = hints[key]
        if not _type_ok(expected, value):
            problems.append(FieldError(at, f"must be {_kind(expected)} ({meta['help']})"))
            continue
        if expected is float:
            value = float(value)
            if not math.isfinite(value):
                problems.append(FieldError(at, "must be a finite number"))
                continue
        low, high = meta.get("low"), meta.get("high")
        if low is not None and (value < low or (meta.get("low_open") and value == low)):
            problems.append(FieldError(at, f"must be {'above' if meta.get('low_open') else 'at least'} {low}"))
            continue
        if high is not None and value > high:
            problems.append(FieldError(at, f"must be at most {high}"))
            continue
        if meta.get("choices") and value not in meta["choices"]:
            problems.append(FieldError(at, f"{value!r} is not one of {', '.join(map(str, meta['choices']))}"))
            continue
        values[key] = value
    return cls(**values), problems


def reference(cls: type, section: str) -> list[tuple[str, Any, str]]:
    """(``section.field``, default, help) for each setting: the config reference and the form read this."""
    out = []
    for f in fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out.append((f"{section}.{f.name}", default, f.metadata["help"]))
    return out
