"""A method's own settings: a small documented dataclass (TRL's ``DPOConfig`` is the model), built once when a config
is read from the YAML section named after the method (``dpo: {beta: 0.1}``) and held as ``TrainConfig.method_settings``.

Each field carries its help text, and its bounds or choices, in ``setting(...)``: the reader, the checks, the form and
the config reference read the same metadata, as TrainConfig's fields do. Reading (``read_settings``) refuses what
cannot be held (a section that is not a mapping, an unknown setting, a value of the wrong type), as ``from_dict`` does
for TrainConfig's fields; ``check_settings`` names the values out of bounds, with the other checks of ``validate``.
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


def read_settings(cls: type, raw: Any, where: str) -> tuple[Any, list[FieldError]]:
    """(settings, problems): ``raw`` (a mapping, or None for the defaults) read into ``cls``; a setting that cannot be
    held (unknown, or of the wrong type) is a problem naming ``where.setting`` and keeps its default."""
    if raw is None:
        return cls(), []
    if isinstance(raw, cls):
        return raw, []
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
        if not _type_ok(hints[key], value):
            problems.append(FieldError(at, f"must be {_kind(hints[key])} ({known[key].metadata['help']})"))
            continue
        values[key] = float(value) if hints[key] is float else value
    return cls(**values), problems


def check_settings(settings: Any, where: str) -> list[FieldError]:
    """Every setting of ``settings`` (a settings dataclass, or None: no settings) outside its bounds or choices,
    named ``where.setting`` with the fix."""
    if settings is None:
        return []
    problems = []
    for f in fields(settings):
        value, meta = getattr(settings, f.name), f.metadata
        at = f"{where}.{f.name}"
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(FieldError(at, "must be a finite number"))
            continue
        low, high = meta.get("low"), meta.get("high")
        if low is not None and (value < low or (meta.get("low_open") and value == low)):
            problems.append(FieldError(at, f"must be {'above' if meta.get('low_open') else 'at least'} {low}"))
        elif high is not None and value > high:
            problems.append(FieldError(at, f"must be at most {high}"))
        elif meta.get("choices") and value not in meta["choices"]:
            problems.append(FieldError(at, f"{value!r} is not one of {', '.join(map(str, meta['choices']))}"))
    return problems


def reference(cls: type, section: str) -> list[tuple[str, Any, str]]:
    """(``section.field``, default, help) for each setting: the config reference and the form read this."""
    out = []
    for f in fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out.append((f"{section}.{f.name}", default, f.metadata["help"]))
    return out
