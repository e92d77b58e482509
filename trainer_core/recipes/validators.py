"""The row checks a recipe declares (its ``validators:`` list), parsed once and run on every generated row.

An entry is one of::

    {type: json_schema, column: C, schema: {...}}            # the value (JSON text or an object) must validate
    {type: regex, column: C, pattern: P, mode: search}       # or mode: fullmatch
    {type: length, column: C, min_chars: 1, max_chars: 2000}  # and/or min_words, max_words
    {type: sql, column: C, schema_sql: "CREATE TABLE ...;"}  # a read query that runs against that schema
    {type: python, file: checks/mine.py, function: check}    # the user's own check (trainer_core.recipes.user_code)

each with an optional ``name`` (letters, digits and _; it prefixes the reasons). ``parse_validators`` reports every
problem as (field, message) naming the field and the fix, as ``rewards.spec.parse_rewards`` does; schemas are
checked as JSON Schema, patterns compiled and ``schema_sql`` run once. ``RowChecker.check`` runs them in order and
gives None when a row passes, else the first failure's reason on one line, e.g. ``json_schema on answer: 'x' is a
required property``. User patterns run on the ``regex`` module with a time limit and SQL in a fresh in-memory
SQLite database that only reads, under a time limit too; nothing a row holds makes a check raise.
"""
from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import regex
from jsonschema.exceptions import best_match

from trainer_core.recipes import sql_check, user_code
from trainer_core.recipes.rows import lookup
from trainer_core.rewards.builtin import PATTERN_TIMEOUT_S, PatternTimeout, schema_validator
from trainer_core.rewards.spec import schema_problem

KINDS = ("json_schema", "regex", "length", "sql", "python")
SETTINGS = {"json_schema": ("column", "schema"), "regex": ("column", "pattern", "mode"),
            "length": ("column", "min_chars", "max_chars", "min_words", "max_words"),
            "sql": ("column", "schema_sql"), "python": ("file", "function")}
MAX_VALIDATORS = 32
MAX_SCHEMA_SQL = 1 << 20  # characters: a schema and a few seed rows, not a database dump
REASON_CHARS = 300
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


@dataclass(frozen=True)
class ValidatorSpec:
    kind: str                                   # one of KINDS
    name: str                                   # unique in the recipe: the kind, or the function, unless named
    column: str = ""                            # every kind but python
    params: dict = field(default_factory=dict)  # the kind's other settings (schema, pattern, mode, min_chars, ...)
    file: str = ""                              # kind python: the file and the function in it
    function: str = ""

    @property
    def label(self) -> str:
        return f"{self.name} on {self.column}" if self.column else self.name

    def to_dict(self) -> dict:
        if self.kind == "python":
            return {"type": "python", "name": self.name, "file": self.file, "function": self.function}
        return {"type": self.kind, "name": self.name, "column": self.column, **self.params}


def parse_validators(raw: Any, where: str = "validators", *,
                     check_files: bool = True) -> tuple[list[ValidatorSpec], list[tuple[str, str]]]:
    """(specs, problems as (field, message)). ``check_files``: read each Python validator's file (under the allowed
    roots, parses, defines the function); the worker, which runs the run folder's copies, passes False."""
    if raw is None:
        return [], []
    if not isinstance(raw, list):
        return [], [(where, "must be a list of validators, e.g. [{type: length, column: answer, min_chars: 1}]")]
    if len(raw) > MAX_VALIDATORS:
        return [], [(where, f"{len(raw)} validators: at most {MAX_VALIDATORS}")]
    specs: list[ValidatorSpec] = []
    problems: list[tuple[str, str]] = []
    seen: set[str] = set()
    for index, entry in enumerate(raw):
        spec = _parse_one(entry, f"{where}[{index}]", problems, check_files)
        if spec is None:
            continue
        name, n = spec.name, 2
        while name in seen:
            name, n = f"{spec.name}_{n}", n + 1
        seen.add(name)
        specs.append(ValidatorSpec(**{**spec.__dict__, "name": name}))
    return specs, problems


def _parse_one(entry: Any, at: str, problems: list, check_files: bool) -> ValidatorSpec | None:
    if not isinstance(entry, dict):
        problems.append((at, "must be a mapping such as {type: regex, column: answer, pattern: '\\d+'}"))
        return None
    entry = dict(entry)
    kind, name = entry.pop("type", None), entry.pop("name", None)
    if kind not in KINDS:
        problems.append((f"{at}.type", f"unknown validator {kind!r}: choose one of {', '.join(KINDS)}"))
        return None
    if name is not None and (not isinstance(name, str) or not _NAME.fullmatch(name)):
        problems.append((f"{at}.name", "letters, digits and _ only, starting with a letter (it names the check in "
                                       "rejection reasons)"))
        name = None
    for key in [key for key in entry if key not in SETTINGS[kind]]:
        problems.append((f"{at}.{key}", f"'{kind}' has no setting {key!r}: it takes {', '.join(SETTINGS[kind])} "
                                        "and name"))
        entry.pop(key)
    before = len(problems)
    if kind == "python":
        file, function = user_code.parse_entry(entry, at, problems, check_files)
        return None if len(problems) > before else ValidatorSpec("python", name or function, file=file,
                                                                  function=function)
    column = entry.pop("column", None)
    if not isinstance(column, str) or not column.strip():
        problems.append((f"{at}.column", "give the column to check (a column the recipe makes or its seed has)"))
    params = PARSERS[kind](entry, at, problems)
    return None if len(problems) > before else ValidatorSpec(kind, name or kind, column.strip(), params)


def _parse_json_schema(entry: dict, at: str, problems: list) -> dict:
    schema = entry.get("schema")
    if not isinstance(schema, dict):
        problems.append((f"{at}.schema", "give a JSON Schema as a mapping, e.g. {type: object, required: [answer]}"))
        return {}
    problem = schema_problem(schema)
    if problem:
        problems.append((f"{at}.schema", problem))
    return {"schema": schema}


def _parse_regex(entry: dict, at: str, problems: list) -> dict:
    pattern, mode = entry.get("pattern"), entry.get("mode", "search")
    if mode not in ("search", "fullmatch"):
        problems.append((f"{at}.mode", f"{mode!r}: choose search (the pattern anywhere in the value) or fullmatch "
                                       "(the whole value)"))
    if not isinstance(pattern, str) or not pattern:
        problems.append((f"{at}.pattern", "give a regular expression (text), e.g. '^SELECT '"))
        return {}
    try:
        regex.compile(pattern)
    except regex.error as exc:
        problems.append((f"{at}.pattern", f"not a valid regex ({exc})"))
    return {"pattern": pattern, "mode": mode}


def _parse_length(entry: dict, at: str, problems: list) -> dict:
    params = {}
    for key in SETTINGS["length"][1:]:
        value = entry.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            problems.append((f"{at}.{key}", "must be a whole number, 0 or more"))
        else:
            params[key] = value
    if not params and not any(f"{at}.{key}" == f for f, _ in problems for key in SETTINGS["length"]):
        problems.append((at, "give at least one of min_chars, max_chars, min_words and max_words"))
    for unit in ("chars", "words"):
        low, high = params.get(f"min_{unit}"), params.get(f"max_{unit}")
        if low is not None and high is not None and low > high:
            problems.append((f"{at}.min_{unit}", f"{low} is more than max_{unit} ({high})"))
    return params


def _parse_sql(entry: dict, at: str, problems: list) -> dict:
    schema_sql = entry.get("schema_sql")
    if not isinstance(schema_sql, str) or not schema_sql.strip():
        problems.append((f"{at}.schema_sql", "give the SQL that builds the database (CREATE TABLE ...;), as text"))
        return {}
    if len(schema_sql) > MAX_SCHEMA_SQL:
        problems.append((f"{at}.schema_sql", f"{len(schema_sql):,} characters: at most {MAX_SCHEMA_SQL:,}"))
        return {}
    try:
        sql_check.database(schema_sql).close()
    except (sqlite3.Error, ValueError) as exc:
        problems.append((f"{at}.schema_sql", f"does not execute ({exc}): fix the SQL so that SQLite runs it"))
    return {"schema_sql": schema_sql}


PARSERS: dict[str, Callable[[dict, str, list], dict]] = {
    "json_schema": _parse_json_schema, "regex": _parse_regex, "length": _parse_length, "sql": _parse_sql}


# ---------------------------------------------------------------------- checking rows
class RowChecker:
    """The recipe's validators, ready to run. Python validators run in a child process (``user_code``) from the
    run folder's hashed copies, so ``run_dir`` is required when there are any: only the recipe's worker builds one
    with them. Close it (or use ``with``) to end that process."""

    def __init__(self, specs: list[ValidatorSpec], run_dir: Path | None = None, *, timeout_s: float | None = None):
        python = [spec for spec in specs if spec.kind == "python"]
        if python and run_dir is None:
            raise ValueError("Python validators run the user's code: only the recipe's worker checks rows with them, "
                             "from the run folder's copies (give run_dir)")
        self.specs = list(specs)
        self._code = user_code.ValidatorProcess(python, run_dir, timeout_s) if python else None
        calls = iter(range(len(python)))
        self._steps = [self._python_step(next(calls)) if spec.kind == "python" else _column_step(spec)
                       for spec in specs]

    def _python_step(self, index: int) -> Callable[[dict], str | None]:
        return lambda row: self._code.call(index, row)

    def check(self, row: dict) -> str | None:
        """None when every validator passes ``row``, else the first failure's reason (one line, at most
        REASON_CHARS characters)."""
        if not isinstance(row, dict):
            return _short(f"the row is a {type(row).__name__}, not a mapping of columns")
        for spec, step in zip(self.specs, self._steps):
            why = step(row)
            if why is not None:
                return _short(f"{spec.label}: {why}")
        return None

    def close(self) -> None:
        if self._code is not None:
            self._code.close()

    def __enter__(self) -> RowChecker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _column_step(spec: ValidatorSpec) -> Callable[[dict], str | None]:
    check = _CHECKS[spec.kind](spec)

    def step(row: dict) -> str | None:
        found, value = lookup(row, spec.column)
        if not found:
            return f"the row has no column {spec.column!r} (its columns: {', '.join(map(str, row)) or 'none'})"
        try:
            return check(value)
        except (RecursionError, MemoryError):
            return "the value is nested too deeply or too large to check"
        except Exception as exc:  # noqa: BLE001 - a value is arbitrary data: a check it breaks fails that row, named
            return f"could not be checked ({type(exc).__name__}: {exc})"

    return step


def _short(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= REASON_CHARS else line[:REASON_CHARS - 1] + "…"


def value_text(value: Any) -> str:
    """A value as the text patterns, lengths and SQL see: text as it is, None empty, anything else as JSON."""
    if isinstance(value, str):
        return value
    return "" if value is None else json.dumps(value, ensure_ascii=False, default=str)


def _json_schema_check(spec: ValidatorSpec) -> Callable[[Any], str | None]:
    validator = schema_validator(spec.params["schema"])

    def check(value: Any) -> str | None:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                return f"not valid JSON ({exc})"
        try:
            error = best_match(validator.iter_errors(value))
        except PatternTimeout:
            return f"a pattern in the schema took longer than {PATTERN_TIMEOUT_S:g} s on this value"
        if error is None:
            return None
        where = "/".join(map(str, error.absolute_path))
        return error.message + (f" (at {where})" if where else "")

    return check


def _regex_check(spec: ValidatorSpec) -> Callable[[Any], str | None]:
    pattern, mode = regex.compile(spec.params["pattern"]), spec.params["mode"]

    def check(value: Any) -> str | None:
        text = value_text(value)
        try:
            found = getattr(pattern, mode)(text, timeout=PATTERN_TIMEOUT_S)
        except TimeoutError:
            return (f"the pattern took longer than {PATTERN_TIMEOUT_S:g} s on this value ({len(text):,} characters): "
                    "rewrite it so that each character can match in one way only")
        if found:
            return None
        return f"does not match {pattern.pattern!r}" + (" in full" if mode == "fullmatch" else "")

    return check


def _length_check(spec: ValidatorSpec) -> Callable[[Any], str | None]:
    limits = spec.params

    def check(value: Any) -> str | None:
        text = value_text(value)
        for unit, count in (("chars", len(text)), ("words", len(text.split()))):
            shown = f"{count:,} {'characters' if unit == 'chars' else 'words'}"
            if f"min_{unit}" in limits and count < limits[f"min_{unit}"]:
                return f"{shown}: at least {limits[f'min_{unit}']:,} (min_{unit})"
            if f"max_{unit}" in limits and count > limits[f"max_{unit}"]:
                return f"{shown}: at most {limits[f'max_{unit}']:,} (max_{unit})"
        return None

    return check


def _sql_check(spec: ValidatorSpec) -> Callable[[Any], str | None]:
    schema_sql = spec.params["schema_sql"]
    return lambda value: sql_check.query_problem(schema_sql, value_text(value))


_CHECKS: dict[str, Callable[[ValidatorSpec], Callable[[Any], str | None]]] = {
    "json_schema": _json_schema_check, "regex": _regex_check, "length": _length_check, "sql": _sql_check}


def needs_admin(specs: list[ValidatorSpec]) -> bool:
    """A recipe with a Python validator executes the user's code on the host: in shared mode only an admin may
    start it (user_code.ADMIN_REASON says so)."""
    return any(spec.kind == "python" for spec in specs)
