"""GRPO tools: what a run's ``grpo.tools`` list says, checked without running user code, and the files copied into
the run folder with their sha256 (like custom rewards, trainer_core.rewards.files).

An entry is a Python file (``tools/calc.py``: every public top-level function in it is a tool) or a mapping
``{python: FILE, functions: [NAME, ...]}`` that picks some. During GRPO's rollouts the model calls them by name
(TRL's GRPOTrainer ``tools=``), so each tool needs what transformers builds its JSON schema from: a docstring, a type
hint on every parameter and an ``Args:`` line describing each one. Validation reads the file with ``ast`` and never
imports it: user code runs only in the worker, and only for the roles ``needs_admin`` names.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer_core.protocol import paths
from trainer_core.rewards.spec import read_reward_file, sha256_text

MAX_TOOL_FILES = 8
MAX_TOOLS = 32
MANIFEST = "manifest.json"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
EXAMPLE = ('def add(a: int, b: int) -> int:\n    """Add two numbers.\n\n    Args:\n        a: The first number.\n'
           '        b: The second number.\n    """')


@dataclass(frozen=True)
class ToolFile:
    python: str                       # the file, as the config names it
    functions: tuple[str, ...] = ()   # the tools it offers; () for every public top-level function

    def to_dict(self) -> dict:
        return {"python": self.python, "functions": list(self.functions)}


def parse_tools(raw: Any, where: str = "grpo.tools") -> tuple[list[ToolFile], list[tuple[str, str]]]:
    """(tool files, problems as (field, message)); nothing is read from disk here."""
    if raw is None or raw == []:
        return [], []
    if not isinstance(raw, list):
        return [], [(where, "must be a list of Python files, e.g. [tools/calc.py]")]
    if len(raw) > MAX_TOOL_FILES:
        return [], [(where, f"{len(raw)} tool files: at most {MAX_TOOL_FILES}")]
    specs, problems = [], []
    for index, entry in enumerate(raw):
        at = f"{where}[{index}]"
        if isinstance(entry, str):
            entry = {"python": entry}
        if not isinstance(entry, dict):
            problems.append((at, "must be a file path or {python: FILE, functions: [NAME, ...]}"))
            continue
        entry = dict(entry)
        path, functions = entry.pop("python", None), entry.pop("functions", [])
        for key in entry:
            problems.append((f"{at}.{key}", "a tool file takes python and functions only"))
        if not isinstance(path, str) or not path.strip():
            problems.append((f"{at}.python", "give the path of a .py file under the allowed roots"))
            continue
        if not isinstance(functions, list) or not all(isinstance(f, str) and _NAME.fullmatch(f) for f in functions):
            problems.append((f"{at}.functions", "a list of function names defined in the file (leave it out for "
                                                "every public function)"))
            continue
        specs.append(ToolFile(python=path.strip(), functions=tuple(functions)))
    return specs, problems


def tool_problems(tree: ast.Module, wanted: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(the tools the module offers, why some cannot be tools): public top-level plain defs, or those ``wanted``."""
    defs = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names = list(wanted) or [name for name in defs if not name.startswith("_")]
    problems = []
    for name in names:
        node = defs.get(name)
        if node is None:
            problems.append(f"defines no top-level function '{name}'")
        elif isinstance(node, ast.AsyncFunctionDef):
            problems.append(f"{name} is async: a tool must be a plain def (each call runs with a time limit)")
        else:
            problems += [f"{name}: {problem}" for problem in _schema_problems(node)]
    return names, problems


def _schema_problems(node: ast.FunctionDef) -> list[str]:
    """What transformers' get_json_schema would refuse in this def: it builds the schema the model sees from it."""
    doc = ast.get_docstring(node)
    if not doc:
        return ["has no docstring: the model learns what a tool does from it (a first line, then Args:)"]
    params = [a for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
    problems = []
    if node.args.vararg or node.args.kwarg:
        problems.append("takes *args or **kwargs: name every parameter (the model calls tools with JSON arguments)")
    args_section = doc.split("Args:", 1)[1] if "Args:" in doc else ""
    for arg in params:
        if arg.annotation is None:
            problems.append(f"parameter '{arg.arg}' has no type hint (e.g. {arg.arg}: int)")
        if not re.search(rf"^\s*{re.escape(arg.arg)}\s*(\([^)]*\))?\s*:", args_section, re.MULTILINE):
            problems.append(f"parameter '{arg.arg}' is not described under Args: in the docstring")
    return problems


def source_problem(spec: ToolFile) -> tuple[Path | None, list[str], str | None]:
    """(resolved file, its tool names, None) or (None, [], why it cannot be used). Nothing is executed."""
    problem = paths.path_problem(spec.python)
    if problem:
        return None, [], problem
    try:
        path = paths.resolve_inside(Path(spec.python).expanduser(), paths.allowed_data_roots())
    except paths.UnsafePathError as exc:
        return None, [], f"{exc}: a tool file must be under the allowed roots (FINETUNE_STUDIO_ALLOWED_ROOTS)"
    if path.suffix != ".py" or not path.is_file():
        return None, [], f"{spec.python} is not a .py file"
    try:
        tree = ast.parse(read_reward_file(path))
    except (OSError, ValueError) as exc:
        return None, [], str(exc)
    except SyntaxError as exc:
        return None, [], f"{spec.python}: the file does not parse: line {exc.lineno}: {exc.msg}"
    names, problems = tool_problems(tree, spec.functions)
    if not names:
        return None, [], (f"{spec.python} defines no tool (a public top-level function with a docstring and typed "
                          f"parameters), e.g.\n{EXAMPLE}")
    if problems:
        return None, [], f"{spec.python}: " + "; ".join(problems)
    return path, names, None


def problems_of(specs: list[ToolFile], where: str = "grpo.tools") -> list[tuple[str, str]]:
    """Every file checked (under the roots, parses, offers tools with schemas); names unique across the files."""
    found, seen = [], {}
    for index, spec in enumerate(specs):
        _, names, problem = source_problem(spec)
        if problem:
            found.append((f"{where}[{index}].python", problem))
        for name in names:
            if name in seen:
                found.append((f"{where}[{index}].functions", f"a tool named '{name}' is already in {seen[name]}: "
                                                             "the model calls tools by name, so each name once"))
            seen.setdefault(name, spec.python)
    if len(seen) > MAX_TOOLS:
        found.append((where, f"{len(seen)} tools: at most {MAX_TOOLS} (each one's schema is in every prompt)"))
    return found


def folder(run_dir: Path) -> Path:
    return run_dir / "tools"


def snapshot(specs: list[ToolFile], run_dir: Path) -> list[dict]:
    """Copy every tool file into the run folder (tools/<index>.py); returns the manifest rows."""
    rows = []
    for index, spec in enumerate(specs):
        path, names, problem = source_problem(spec)
        if problem:
            raise ValueError(problem)
        text = read_reward_file(path)
        target = folder(run_dir) / f"{index}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        rows.append({"index": index, "source": str(path), "functions": names, "sha256": sha256_text(text)})
    if rows:
        (folder(run_dir) / MANIFEST).write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return rows


def checked_copies(run_dir: Path) -> list[tuple[Path, list[str]]]:
    """(the run folder's copy, its tool names) per tool file, refused when one no longer matches its hash."""
    try:
        rows = json.loads((folder(run_dir) / MANIFEST).read_text(encoding="utf-8"))
        copies = [(folder(run_dir) / f"{int(row['index'])}.py", list(row["functions"]), row["sha256"]) for row in rows]
    except (OSError, ValueError, KeyError, TypeError):
        raise RuntimeError(f"grpo.tools: the run folder has no readable tools/{MANIFEST}; start the run again so the "
                           "tool files are copied") from None
    for copy, _, digest in copies:
        if not copy.is_file() or sha256_text(copy.read_text(encoding="utf-8")) != digest:
            raise RuntimeError(f"grpo.tools: tools/{copy.name} is missing or was changed after the run was submitted "
                               "(its sha256 differs); start a new run with the edited file")
    return [(copy, names) for copy, names, _ in copies]
