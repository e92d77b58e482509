"""Checkpoint folders: finding the latest completed one, and removing in-flight partials safely.

Complete means transformers finished its save: it writes the weights, optimizer, scheduler and RNG state, and
trainer_state.json last, straight into ``checkpoint-<step>``; a kill -9 at any point before that write ended
leaves a folder without that file, or with a cut-short one."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from trainer_core.protocol.paths import UnsafePathError

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
TMP_CHECKPOINT_RE = re.compile(r"^tmp-checkpoint-(\d+)$")
# Set by the Ray launcher on workers that Ray Train restarted after a lost rank (worker/ray_entry.py): the run's own
# latest completed checkpoint, which every rank resumes from instead of config.yaml's resume_from_checkpoint.
RESUME_ENV = "FINETUNE_STUDIO_RESUME_FROM"


def is_complete(folder: Path) -> bool:
    """Whether a checkpoint folder's save finished: a real folder whose trainer_state.json is a whole JSON object
    (read in full: a few hundred KB at most, and only when checkpoints are listed)."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    try:
        return isinstance(json.loads((folder / "trainer_state.json").read_bytes()), dict)
    except (OSError, ValueError):  # missing, unreadable, cut short, or not text
        return False


def completed_checkpoints(output_dir: Path) -> list[Path]:
    """Completed ``checkpoint-<int>`` folders (``is_complete``), oldest step first."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = []
    for child in output_dir.iterdir():
        match = CHECKPOINT_RE.match(child.name)
        if match and is_complete(child):
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def latest_checkpoint(output_dir: Path) -> Path | None:
    found = completed_checkpoints(output_dir)
    return found[-1] if found else None


def remove_partial_checkpoints(output_dir: Path, outputs_root: Path) -> list[Path]:
    """Delete in-flight ``tmp-checkpoint-<int>`` folders and the ``checkpoint-<int>`` folders whose save never
    finished (not ``is_complete``: a worker killed while saving) under ``output_dir``; return what was removed.
    Call it only when no save is under way (the worker's training loop has ended, or its process has exited).

    Completed ``checkpoint-<int>`` folders are never touched, other names never (numeric suffixes only),
    symlinks are never followed or removed, a missing folder is a no-op, and an ``output_dir`` outside
    ``outputs_root`` is refused.
    """
    output_dir = Path(output_dir)
    root = Path(outputs_root).resolve()
    if output_dir.is_symlink():
        raise UnsafePathError(f"{output_dir} is a symlink; refusing to clean through it")
    resolved = output_dir.resolve()
    if resolved != root and root not in resolved.parents:
        raise UnsafePathError(f"{output_dir} is outside the outputs root {root}; refusing to clean it")
    if not resolved.is_dir():
        return []
    removed = []
    for child in resolved.iterdir():
        if child.is_symlink() or not child.is_dir():
            continue
        if not (TMP_CHECKPOINT_RE.match(child.name) or (CHECKPOINT_RE.match(child.name) and not is_complete(child))):
            continue
        shutil.rmtree(child)  # rmtree does not follow symlinks inside the tree (it unlinks them)
        removed.append(child)
    return removed


def resume_point(run_dir: Path, configured: str, environ: dict[str, str]) -> str | None:
    """The checkpoint a worker resumes from: after a restart of its Ray workers (``RESUME_ENV``), one of this run's
    own completed checkpoints; otherwise config.yaml's ``resume_from_checkpoint`` (None: from the start)."""
    restart = environ.get(RESUME_ENV, "")
    if not restart:
        return configured or None
    path = Path(restart)
    if path.resolve() not in {c.resolve() for c in completed_checkpoints(Path(run_dir) / "checkpoints")}:
        raise UnsafePathError(f"{RESUME_ENV}={restart} is not a completed checkpoint of this run ({run_dir})")
    return str(path)
