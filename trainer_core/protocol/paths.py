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

    The data root always; extra roots from ``FINETUNE_STUDIO_ALLOWED_ROOTS`` (os.pathsep separated). The working
    directory is not one by default: it is usually the checkout (the code, ``.git``, ``.streamlit/secrets.toml``).
    """
    extra = os.environ.get("FINETUNE_STUDIO_ALLOWED_ROOTS") or ""
    return [data_root(), *(Path(p).expanduser() for p in extra.split(os.pathsep) if p)]


def hub_data_roots() -> list[Path]:
    """Where files a hub split refers to may lie: the allowed roots and the ``datasets`` cache (a hub split's
    Image/Audio values carry bytes, or a path into that cache; any other path is refused)."""
    cache = os.environ.get("HF_DATASETS_CACHE")
    if not cache:
        home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
        cache = os.path.join(home, "datasets")
    return [*allowed_data_roots(), Path(cache).expanduser()]


# ---------------------------------------------------------------------- files named inside user data
CHECKOUT = Path(__file__).resolve().parents[2]  # the code: never data, even where an allowed root holds it
DATA_REF_PLACES = ("in the dataset's folder or the datasets folder (uploads); a hub split's, in the datasets cache "
                   "or an allowed root (FINETUNE_STUDIO_ALLOWED_ROOTS)")
NOT_DATA_NAMES = frozenset({"studio.db", ".secrets.json", "secrets.toml"})


def data_ref_roots(folder: Path | None) -> list[Path]:
    """Where a file named inside a dataset (an image, a clip, a document) may lie: under the dataset's own folder
    and the datasets folder (uploads and generated datasets); for a hub split (``folder`` None), under the allowed
    roots and the ``datasets`` cache. ``resolve_data_ref`` refuses what is not data even there."""
    return [folder, datasets_dir()] if folder is not None else hub_data_roots()


def resolve_data_ref(path: str | os.PathLike, roots: list[Path]) -> Path:
    """``path``, named by a dataset's row, resolved (symlinks included) under ``roots`` and refused
    (UnsafePathError) where it is not user data: the database and its -wal/-shm, the data root outside its datasets
    folder (run folders, caches, locks), the checkout, any hidden file or folder (``.git``, ``.streamlit``,
    ``.secrets.json``, an upload in progress)."""
    resolved = resolve_inside(path, roots)
    problem = _not_data(resolved, roots)
    if problem:
        raise UnsafePathError(f"{path} resolves to {problem}, which is not user data")
    return resolved


def _not_data(resolved: Path, roots: list[Path]) -> str | None:
    name = resolved.name
    if name in NOT_DATA_NAMES or name.startswith("studio.db-"):
        return "the database or a secrets file"
    root = max((r.resolve() for r in roots if r.resolve() == resolved or r.resolve() in resolved.parents),
               key=lambda r: len(r.parts))
    hidden = any(part.startswith(".") for part in resolved.relative_to(root).parts)
    if hidden or {".git", ".streamlit"} & set(resolved.parts):
        return "a hidden file or folder (.git, .streamlit, secrets)"
    datasets = datasets_dir().resolve()
    if resolved == datasets or datasets in resolved.parents:
        return None
    if resolved == data_root() or data_root() in resolved.parents:
        return "the data root outside its datasets folder (run folders, caches)"
    if resolved == CHECKOUT or CHECKOUT in resolved.parents:
        return "the Finetune Studio checkout"
    return None


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
