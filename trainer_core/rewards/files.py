"""Custom reward files: copied into the run folder at submit, with their sha256, so a run can be reproduced
and audited (the file it used, even after the original was edited); the worker loads only the copy, and only
when its hash still matches. The dashboard side reads the text, never imports it."""
from __future__ import annotations

import json
from pathlib import Path

from trainer_core.protocol import paths
from trainer_core.rewards.spec import RewardSpec, function_problem, read_reward_file, sha256_text

MANIFEST = "manifest.json"


def folder(run_dir: Path) -> Path:
    return run_dir / "rewards"


def source_problem(spec: RewardSpec) -> tuple[Path | None, str | None]:
    """(resolved file, None) or (None, why it cannot be used): under the allowed roots, a .py file that
    parses and defines the function. Nothing is executed."""
    path, text, problem = read_source(spec.python)
    if problem:
        return None, problem
    problem = function_problem(text, spec.function)
    return (path, None) if problem is None else (None, f"{spec.python}: {problem}")


def read_source(python: str, what: str = "reward") -> tuple[Path | None, str, str | None]:
    """(resolved file, its text, None) or (None, "", why it cannot be used): a .py file under the allowed roots, of
    at most MAX_REWARD_FILE bytes. Nothing is executed. ``what`` names the file's use in the message (the
    Playground's tool functions are checked as rewards are)."""
    problem = paths.path_problem(python)
    if problem:
        return None, "", problem
    try:
        path = paths.resolve_inside(Path(python).expanduser(), paths.allowed_data_roots())
    except paths.UnsafePathError as exc:
        return None, "", f"{exc}: a {what} file must be under the allowed roots (FINETUNE_STUDIO_ALLOWED_ROOTS)"
    if path.suffix != ".py" or not path.is_file():
        return None, "", f"{python} is not a .py file"
    try:
        return path, read_reward_file(path, what), None
    except (OSError, ValueError) as exc:
        return None, "", str(exc)


def snapshot(specs: list[RewardSpec], run_dir: Path) -> list[dict]:
    """Copy every Python reward's file into the run folder; returns the manifest rows (name, source, sha256)."""
    rows = []
    for spec in specs:
        if spec.kind != "python":
            continue
        path, problem = source_problem(spec)
        if problem:
            raise ValueError(problem)
        text = read_reward_file(path)
        target = folder(run_dir) / f"{spec.name}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        rows.append({"name": spec.name, "source": str(path), "function": spec.function, "sha256": sha256_text(text)})
    if rows:
        (folder(run_dir) / MANIFEST).write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return rows


def checked_copy(run_dir: Path, spec: RewardSpec) -> Path:
    """The run folder's copy of a reward file, refused when it no longer matches the hash taken at submit."""
    try:
        manifest = {row["name"]: row for row in json.loads((folder(run_dir) / MANIFEST).read_text())}
    except (OSError, ValueError, KeyError, TypeError):
        raise RuntimeError(f"reward {spec.name}: the run folder has no readable rewards/{MANIFEST}; "
                           "start the run again so the reward file is copied") from None
    copy = folder(run_dir) / f"{spec.name}.py"
    row = manifest.get(spec.name)
    if row is None or not copy.is_file() or sha256_text(copy.read_text(encoding="utf-8")) != row.get("sha256"):
        raise RuntimeError(f"reward {spec.name}: rewards/{copy.name} is missing or was changed after the run "
                           "was submitted (its sha256 differs); start a new run with the edited file")
    return copy
