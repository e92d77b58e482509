"""GRPO reward settings: what a run's ``grpo.rewards`` list says, checked without running user code.

An entry is a built-in (``{type: length, target: 20, weight: 1.0}``, or just ``length``), the user's own
Python function (``{python: rewards/mine.py, function: my_reward, weight: 1.0}``) or a reward model
(``{model: path/or/hub-id}``, e.g. the final model of a ``reward`` run). Validation parses a Python file
(``ast``) to see that the function exists, but never imports it: user code runs only in the worker and in
the reward check's subprocess, and only for the roles ``needs_admin`` names.
"""
from __future__ import annotations

import ast
import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex

from trainer_core.rewards.builtin import BUILTINS, CHOICES, PARAMS

MAX_REWARDS = 16
MAX_REWARD_FILE = 1 << 20  # bytes: a reward module is code, not data
MAX_SCHEMA_DEPTH = 64  # dicts and lists nested in a json_valid schema: real schemas stay far below it
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


@dataclass(frozen=True)
class RewardSpec:
    kind: str                      # a BUILTINS name, "python" or "model"
    name: str                      # the metric key part: rewards/<name>/mean
    weight: float = 1.0
    params: dict = field(default_factory=dict)
    python: str = ""               # kind "python": the file, and the function in it
    function: str = ""
    model: str = ""                # kind "model": a sequence-classification model folder or hub id

    def to_dict(self) -> dict:
        if self.kind == "python":
            return {"python": self.python, "function": self.function, "weight": self.weight, "name": self.name}
        if self.kind == "model":
            return {"model": self.model, "weight": self.weight, "name": self.name}
        return {"type": self.kind, "weight": self.weight, "name": self.name, **self.params}


def parse_rewards(raw: Any, where: str = "grpo.rewards") -> tuple[list[RewardSpec], list[tuple[str, str]]]:
    """(specs, problems): every entry read, every problem as (field, message). Names are made unique."""
    problems: list[tuple[str, str]] = []
    if raw is None:
        return [], problems
    if not isinstance(raw, list):
        return [], [(where, "must be a list of rewards, e.g. [{type: length, target: 20}]")]
    if len(raw) > MAX_REWARDS:
        return [], [(where, f"{len(raw)} rewards: at most {MAX_REWARDS}")]
    specs, seen = [], set()
    for index, entry in enumerate(raw):
        spec = _parse_one(entry, f"{where}[{index}]", problems)
        if spec is None:
            continue
        name, n = spec.name, 2
        while name in seen:
            name, n = f"{spec.name}_{n}", n + 1
        seen.add(name)
        specs.append(RewardSpec(**{**spec.__dict__, "name": name}))
    return specs, problems


def _parse_one(entry: Any, at: str, problems: list) -> RewardSpec | None:
    if isinstance(entry, str):
        entry = {"type": entry}
    if not isinstance(entry, dict):
        problems.append((at, "must be a built-in name or a mapping such as {type: format, preset: think_answer}"))
        return None
    entry = dict(entry)
    weight = entry.pop("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        problems.append((f"{at}.weight", "must be a finite number (e.g. 1.0)"))
        weight = 1.0
    name = entry.pop("name", None)
    if name is not None and (not isinstance(name, str) or not _NAME.fullmatch(name)):
        problems.append((f"{at}.name", "letters, digits and _ only, starting with a letter (it names the metric)"))
        name = None
    if "python" in entry or "function" in entry:
        return _parse_python(entry, at, float(weight), name, problems)
    if "model" in entry:
        return _parse_model(entry, at, float(weight), name, problems)
    kind = entry.pop("type", None)
    if kind not in BUILTINS:
        problems.append((f"{at}.type", f"unknown reward {kind!r}: choose one of {', '.join(BUILTINS)}, or give "
                                       "python: FILE and function: NAME for your own"))
        return None
    params = _check_params(kind, entry, at, problems)
    return RewardSpec(kind=kind, name=name or kind, weight=float(weight), params=params)


def _check_params(kind: str, given: dict, at: str, problems: list) -> dict:
    table = PARAMS[kind]
    params = {}
    for key, value in given.items():
        if key not in table:
            problems.append((f"{at}.{key}", f"'{kind}' has no parameter '{key}': it takes {', '.join(table)}"))
            continue
        expected = table[key][0]
        if isinstance(value, bool) and expected is not bool or not isinstance(value, expected):
            problems.append((f"{at}.{key}", f"must be {expected.__name__} ({table[key][2]})"))
            continue
        choices = CHOICES.get((kind, key))
        if choices and value not in choices:
            problems.append((f"{at}.{key}", f"{value!r} is not one of {', '.join(c or repr(c) for c in choices)}"))
            continue
        params[key] = value
    if kind == "length" and params.get("target", 20) < 1:
        problems.append((f"{at}.target", "must be at least 1"))
    if kind == "length" and params.get("tolerance", 0) < 0:
        problems.append((f"{at}.tolerance", "must be 0 or more"))
    if kind == "no_repetition" and not 1 <= params.get("ngram", 3) <= 20:
        problems.append((f"{at}.ngram", "must be between 1 and 20"))
    if kind == "format":
        if params.get("pattern") and params.get("preset"):
            problems.append((f"{at}.pattern", "give pattern or preset, not both"))
        elif params.get("pattern"):
            try:
                regex.compile(params["pattern"])  # the engine the reward runs it on (builtin.py: with a time limit)
            except regex.error as exc:
                problems.append((f"{at}.pattern", f"not a valid regex ({exc})"))
    if kind in ("contains", "not_contains"):
        words = params.get("keywords", [])
        if not words or not all(isinstance(w, str) and w for w in words):
            problems.append((f"{at}.keywords", "a non-empty list of non-empty strings"))
    if kind == "json_valid" and params.get("schema"):
        problem = schema_problem(params["schema"])
        if problem:
            problems.append((f"{at}.schema", problem))
    return params


def _depth(value: Any) -> int:
    """How many dicts and lists are nested in ``value`` (1: a flat one), counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children)
    return deepest


def schema_problem(schema: dict) -> str | None:
    """Why ``schema`` cannot check values (with builtin.schema_validator's time limits), or None."""
    import jsonschema  # altair's own dependency: always installed with the dashboard

    depth = _depth(schema)
    if depth > MAX_SCHEMA_DEPTH:  # jsonschema checks (and validates) recursively: 200 levels raised RecursionError
        return (f"nested {depth} levels deep: at most {MAX_SCHEMA_DEPTH} (flatten it, or name repeated parts under "
                "$defs and point to them with $ref)")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"not a valid JSON schema ({exc.message})"
    except RecursionError:  # within the depth limit on a small stack (a worker thread): still a field error
        return "too deeply nested to check: flatten it, or name repeated parts under $defs and point to them with $ref"
    return _pattern_problem(schema)


def _pattern_problem(schema: dict) -> str | None:
    """Why the schema's patterns cannot all run in builtin.schema_validator (with a time limit), or None."""
    keywords, stack = set(), [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            keywords.update(key for key in node if isinstance(key, str))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    if {"patternProperties", "unevaluatedProperties"} <= keywords:  # jsonschema matches those with re, untimed
        return ("patternProperties with unevaluatedProperties cannot be checked with a time limit: use "
                "additionalProperties instead of unevaluatedProperties")
    return None


def _parse_python(entry: dict, at: str, weight: float, name: str | None, problems: list) -> RewardSpec | None:
    path, function = entry.pop("python", ""), entry.pop("function", "")
    for key in entry:
        problems.append((f"{at}.{key}", "a python reward takes python, function, weight and name only"))
    if not isinstance(path, str) or not path.strip():
        problems.append((f"{at}.python", "give the path of a .py file under the allowed roots"))
        return None
    if not isinstance(function, str) or not _NAME.fullmatch(function):
        problems.append((f"{at}.function", "give the name of a function defined in the file"))
        return None
    return RewardSpec(kind="python", name=name or function, weight=weight, python=path.strip(), function=function)


def _parse_model(entry: dict, at: str, weight: float, name: str | None, problems: list) -> RewardSpec | None:
    model = entry.pop("model")
    for key in entry:
        problems.append((f"{at}.{key}", "a reward model takes model, weight and name only"))
    if not isinstance(model, str) or not model.strip():
        problems.append((f"{at}.model", "a folder of a sequence-classification model, or a hub id"))
        return None
    return RewardSpec(kind="model", name=name or "reward_model", weight=weight, model=model.strip())


def read_reward_file(path: Path, what: str = "reward") -> str:
    """The text of a reward file (or ``what`` else: a recipe's validator), checked for size; raises ValueError with
    the reason."""
    size = path.stat().st_size
    if size > MAX_REWARD_FILE:
        raise ValueError(f"{path} is {size:,} bytes: a {what} file may be at most {MAX_REWARD_FILE:,}")
    return path.read_bytes().decode("utf-8", errors="strict")


def function_problem(text: str, function: str, what: str = "reward") -> str | None:
    """Why ``function`` cannot be called from this module text (found without running it), or None. ``what`` names
    the function's use in the message (a reward, a recipe's validator)."""
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        return f"the file does not parse: line {exc.lineno}: {exc.msg}"
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            if isinstance(node, ast.AsyncFunctionDef):
                return f"{function} is async: a {what} function must be a plain def"
            return None
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == function for t in node.targets):
            return None  # e.g. my_reward = functools.partial(...): callable, checked when it runs
    return f"the file defines no top-level function '{function}'"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def needs_admin(specs: list[RewardSpec]) -> bool:
    """A run with a Python reward executes the user's code on the host: only an admin may start it."""
    return any(spec.kind == "python" for spec in specs)
