"""A job's secrets by way of its run folder, for a job whose environment is public: Ray keeps a job's entrypoint,
metadata and runtime_env in its job table, which anyone with the cluster's dashboard can read, so a Ray job's
HF_TOKEN, W&B key or judge key never travel there (trainer_core/launchers/ray.py).

The dashboard writes them into the run folder on the shared storage, in a file only its own user can read (mode
0600, created new under a random name and renamed into place: never written through a link someone left there);
the job's environment says only that the file is there (``FLAG_ENV``, no value). The worker reads them into its
own environment at start (``load``), as a local worker finds them in the environment its launcher gives it: a
file that is a link, not a regular file, owned by another user, or readable by others is refused. The file is
removed when the job no longer needs it: by a lone worker as soon as it has read it, by the Ray driver when its
workers are done (they read it again when Ray Train restarts them after a lost node), and by the dashboard when it
records the job's end, whatever killed it. No ML imports: the dashboard writes, the worker reads."""
from __future__ import annotations

import json
import os
import re
import secrets as pysecrets
import stat
from pathlib import Path
from typing import Mapping

FILE = ".secrets.json"  # in the run folder
STAGING_PREFIX = ".secrets-"  # + a random name + .tmp: written, then renamed to FILE
FLAG_ENV = "FINETUNE_STUDIO_SECRETS_IN_RUN_FOLDER"  # "1" in a job's environment: its secrets wait in FILE
NAME = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
# Variables that steer the runtime rather than authenticate: never taken from the file, whatever it says.
NOT_SECRETS = ("LD_", "PYTHON", "FINETUNE_STUDIO_", "PATH", "HOME", "RAY_", "CUDA_", "NCCL_")


class SecretFileError(OSError):
    """The run folder's secrets file is not one the dashboard wrote; the message says what is wrong with it."""


def write(run_dir: Path, values: Mapping[str, str]) -> bool:
    """The secrets ``values`` (environment variable -> value) for the job in ``run_dir``; True when a file was
    written (none when there is nothing secret to pass: a file left from an earlier start is removed)."""
    remove(run_dir)
    wanted = {name: value for name, value in values.items() if value}
    if not wanted:
        return False
    bad = [name for name in wanted if not acceptable(name)]
    if bad:
        raise ValueError(f"not a secret's variable name: {bad[0][:40]!r}")
    staging = run_dir / f"{STAGING_PREFIX}{pysecrets.token_hex(8)}.tmp"
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(wanted, fh)
        os.replace(staging, run_dir / FILE)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    return True


def read(run_dir: Path) -> dict[str, str]:
    """The secrets in ``run_dir``'s file ({} when there is none)."""
    try:
        # O_NONBLOCK: a named pipe in its place opens at once and is refused below (a blocking open waits for a writer)
        fd = os.open(run_dir / FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return {}
    except OSError as exc:  # ELOOP: a link in its place
        raise SecretFileError(f"{run_dir / FILE} cannot be opened as the run's secrets ({exc.strerror}): it is not "
                              "the file the dashboard wrote; remove it and start the job again") from None
    with os.fdopen(fd) as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise SecretFileError(f"{run_dir / FILE} is not a file of this user readable by it alone (mode "
                                  f"{stat.filemode(info.st_mode)}, owner {info.st_uid}): it is not the file the "
                                  "dashboard wrote; remove it and start the job again")
        try:
            data = json.load(fh)
        except ValueError:
            raise SecretFileError(f"{run_dir / FILE} is not the JSON the dashboard writes: remove it and start the "
                                  "job again") from None
    if not isinstance(data, dict):
        raise SecretFileError(f"{run_dir / FILE} is not the JSON the dashboard writes: remove it and start the job "
                              "again")
    return {name: value for name, value in data.items() if acceptable(name) and isinstance(value, str) and value}


def load(run_dir: Path, environ: dict[str, str] | None = None, keep: bool = False) -> list[str]:
    """The worker's side: when its environment says so (``FLAG_ENV``), the run folder's secrets join ``environ``
    (never replacing a variable it has), and the file is removed unless ``keep`` (other ranks, or ranks restarted
    after a lost node, read it again). Returns the names taken, for the log."""
    env = os.environ if environ is None else environ
    if env.get(FLAG_ENV) != "1":
        return []
    taken = {name: value for name, value in read(run_dir).items() if name not in env}
    env.update(taken)
    if not keep:
        remove(run_dir)
    return sorted(taken)


def remove(run_dir: Path) -> None:
    """The file, and any staging file a writer killed before its rename left behind (it holds the same values)."""
    for path in (run_dir / FILE, *Path(run_dir).glob(f"{STAGING_PREFIX}*.tmp")):
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def name_problem(name: str) -> str:
    """Why the variable ``name`` cannot carry a secret to a Ray job ("" when it can)."""
    if acceptable(name):
        return ""
    return (f"launcher: ray: {str(name)[:40]} cannot reach a Ray job: its secrets travel in the run folder under "
            "names like JUDGE_API_KEY only (upper case, not a runtime variable such as PYTHON*, LD_*, RAY_*): have "
            "the admin declare such a variable, or run the job on this host (launcher: local)")


def acceptable(name: object) -> bool:
    return isinstance(name, str) and NAME.fullmatch(name) is not None and not name.startswith(NOT_SECRETS)
