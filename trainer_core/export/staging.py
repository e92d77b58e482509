"""An export's staging folder: made next to its destination, held locked while the worker lives, renamed into
place at the end. A worker killed outright (SIGKILL, the out-of-memory killer) cannot remove its own: the next
export worker and an orchestrator adopting the job remove the ones nobody holds. No ML stack.

A staging folder is ``.<destination name>.tmp-<pid>`` (``runs/<job>/.artifacts.tmp-<pid>``, or beside a chosen
out_dir). Its worker holds an exclusive ``flock`` on the folder itself from the moment it exists; the lock goes
with the process, however it dies, so a folder whose lock is free and whose pid is not its maker is stale.
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
from pathlib import Path

import psutil

from trainer_core.specs import jobspec
from trainer_core.config import ConfigError
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, read_kind

_PID_RE = re.compile(r"\.tmp-(\d{1,10})$")


def staging_path(final: Path, pid: int | None = None) -> Path:
    return final.parent / f".{final.name}.tmp-{os.getpid() if pid is None else pid}"


def create(final: Path) -> tuple[Path, int]:
    """Make this process's staging folder for ``final`` and lock it; returns the folder and the lock's
    descriptor (close it after the folder is renamed or removed)."""
    folder = staging_path(final)
    folder.mkdir()
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # CLOEXEC: a converter never holds it
    fcntl.flock(fd, fcntl.LOCK_EX)
    return folder, fd


def is_stale(folder: Path) -> bool:
    """Nobody holds the folder's lock, and the pid in its name is not the process that made it (gone, or a
    later process given the same pid). A live pid older than the folder is its maker between mkdir and lock,
    or a worker of an older version that held no lock: left alone."""
    match = _PID_RE.search(folder.name)
    if match is None or folder.is_symlink() or not folder.is_dir():
        return False
    pid = int(match.group(1))
    if pid == os.getpid():
        return False
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # a live worker is writing into it
    finally:
        os.close(fd)
    try:
        proc = psutil.Process(pid)
        maker = proc.status() != psutil.STATUS_ZOMBIE and proc.create_time() <= folder.stat().st_ctime
    except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
        maker = False
    return not maker


def remove_stale(job_dir: Path) -> list[Path]:
    """Remove the stale staging folders of the export job in ``job_dir`` (none for other kinds, or when its
    job.json cannot be read); returns what was removed."""
    try:
        if read_kind(job_dir) is not JobKind.EXPORT:
            return []
        spec = jobspec.read_spec(job_dir)
        final = spec.output_dir(job_dir)
    except (OSError, ValueError, ConfigError, paths.UnsafePathError):
        return []
    removed = []
    for folder in final.parent.glob(f".{glob_escape(final.name)}.tmp-*"):
        if is_stale(folder):
            shutil.rmtree(folder, ignore_errors=True)  # rmtree never follows a symlink inside it
            removed.append(folder)
    return removed


def remove_all_stale() -> list[Path]:
    """Every export job's stale staging folders under the data root (an export worker does this as it starts)."""
    removed: list[Path] = []
    for job_dir in sorted(paths.runs_dir().iterdir()):
        if job_dir.is_dir() and not job_dir.is_symlink() and (job_dir / jobspec.SPEC_FILE).is_file():
            removed += remove_stale(job_dir)
    return removed


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)
