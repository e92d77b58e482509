"""Where data lives, and the one function that keeps user paths inside allowed roots.

Layout under the data root (``FINETUNE_STUDIO_HOME``, default ``./studio_data``)::

    studio.db          SQLite database (WAL) unless DATABASE_URL is set
    models/            converted model cache (FINETUNE_STUDIO_MODELS overrides)
    datasets/          uploaded datasets
    runs/<run_id>/     config.yaml, events.jsonl, worker.log, checkpoints, adapter
"""
from __future__ import annotations

import os
import re
from pathlib import Path

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


NAME_MAX = 255  # bytes in one file or folder name (Linux, macOS, Windows)
PATH_MAX = 4096  # bytes in a whole path (Linux)


class UnsafePathError(ValueError):
    """A user-supplied path points outside the roots it is allowed in."""


class BadPathError(UnsafePathError):
    """A user-supplied path no file system can hold (a NUL byte, a name or path that is too long)."""


def path_problem(text: str) -> str | None:
    """Why ``text`` cannot be a path at all, or None. Checked before any OS call, which would otherwise
    raise ValueError (NUL) or OSError (name too long) instead of saying what to fix."""
    shown = repr(text[:40] + ("…" if len(text) > 40 else ""))
    if "\x00" in text:
        return f"{shown} contains a NUL character (\\x00), which no path may contain: remove it"
    try:
        encoded = os.fsencode(text)
    except UnicodeError:
        return f"{shown} contains characters that cannot be part of a file name: retype the path"
    if len(encoded) >= PATH_MAX:
        return f"the path is {len(encoded):,} bytes long; paths are limited to {PATH_MAX - 1:,}: check it"
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        return (f"{shown} has a file or folder name of {len(longest):,} bytes; names are limited to {NAME_MAX}: "
                "check the path")
    return None


def data_root() -> Path:
    root = Path(os.environ.get("FINETUNE_STUDIO_HOME", "studio_data")).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    return root


def models_dir() -> Path:
    override = os.environ.get("FINETUNE_STUDIO_MODELS")
    path = Path(override).expanduser().resolve() if override else data_root() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def datasets_dir() -> Path:
    path = data_root() / "datasets"
    path.mkdir(parents=True, exist_ok=True)
    return path


def runs_dir() -> Path:
    path = data_root() / "runs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_dir(run_id: str) -> Path:
    if not RUN_ID_RE.fullmatch(run_id):  # fullmatch: `$` alone would accept a trailing newline
        raise UnsafePathError(f"run id {run_id!r} has characters that are not allowed")
    return runs_dir() / run_id


def resolve_inside(path: str | os.PathLike, roots: list[Path]) -> Path:
    """Resolve ``path`` (symlinks included) and require it to sit under one of ``roots``."""
    problem = path_problem(os.fspath(path))
    if problem:
        raise BadPathError(problem)
    resolved = Path(path).expanduser().resolve()
    for root in roots:
        root = root.resolve()
        if resolved == root or root in resolved.parents:
            return resolved
    allowed = ", ".join(str(r) for r in roots)
    raise UnsafePathError(f"{path} resolves to {resolved}, which is outside the allowed folders ({allowed})")


def allowed_data_roots() -> list[Path]:
    """Folders a user may point dataset and model paths at.

    The data root always; extra roots from ``FINETUNE_STUDIO_ALLOWED_ROOTS`` (os.pathsep separated),
    which defaults to the current working directory so local files next to the project work.
    """
    extra = os.environ.get("FINETUNE_STUDIO_ALLOWED_ROOTS")
    roots = [data_root()]
    if extra is None:
        roots.append(Path.cwd())
    else:
        roots.extend(Path(p).expanduser() for p in extra.split(os.pathsep) if p)
    return roots


def hub_data_roots() -> list[Path]:
    """Where files a hub split refers to may lie: the allowed roots and the ``datasets`` cache (a hub split's
    Image/Audio values carry bytes, or a path into that cache; any other path is refused)."""
    cache = os.environ.get("HF_DATASETS_CACHE")
    if not cache:
        home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
        cache = os.path.join(home, "datasets")
    return [*allowed_data_roots(), Path(cache).expanduser()]


def inside_run(run_dir: str | os.PathLike, path: str | os.PathLike,
               extra_roots: list[Path] | tuple[Path, ...] = ()) -> Path:
    """``path``, read from a run folder (an event, a row the pump stored), resolved with its symlinks: it must lie
    inside ``run_dir`` or one of ``extra_roots`` (an export target recorded at submit), else UnsafePathError.
    A relative path is taken from the run folder. An extra root that holds the run folder itself ("/", the data
    root) would widen the rule instead of adding a folder, and is ignored. Checked before a path is stored and
    again before a page serves the file (it may have become a symlink since)."""
    text = os.fspath(path)
    problem = path_problem(text) if text else "the path is empty"
    if problem:
        raise BadPathError(problem)
    folder = Path(run_dir).resolve()
    roots = [folder] + [r for r in (Path(p).resolve() for p in extra_roots) if r != folder and r not in folder.parents]
    resolved = (folder / text).resolve()  # an absolute ``text`` replaces the folder
    if any(resolved == root or root in resolved.parents for root in roots):
        return resolved
    shown = text if len(text) <= 120 else text[:119] + "…"
    raise UnsafePathError(f"{shown!r} resolves to {resolved}, outside the job's folder {folder}"
                          + (f" and its export folder {', '.join(str(r) for r in roots[1:])}" if roots[1:] else ""))
