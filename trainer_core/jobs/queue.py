"""The queue: which jobs may run at the same time, and the lock under which one is started.

Devices: a run on a CPU host holds "cpu"; on a GPU host it holds the GPUs in ``gpu_ids`` ("gpu0,gpu1"),
or every visible GPU ("gpu*") when none are named. Two runs whose device sets overlap never train at the
same time. The queue is first come, first served with backfill: a queued run may start before an earlier
one only when it overlaps neither the running runs nor any earlier queued run (so nobody starves).
"""
from __future__ import annotations

import dataclasses
import fcntl
import os
from pathlib import Path
from typing import IO, Any

from db.entities import RunRecord
from db.store import Store
from trainer_core.host import parallel
from trainer_core.host import hardware
from trainer_core.config import ConfigError, TrainConfig
from trainer_core.data import loading
from trainer_core.jobs import adoption
from trainer_core.protocol import paths, secrets
from trainer_core.specs.jobspec import JobSpec, read_spec
from trainer_core.protocol.status import JobKind, RunStatus

ALL_GPUS = "gpu*"
NO_DEVICE = "none"  # a job that needs no device: it never waits in the queue for one


def devices_of(cfg: TrainConfig | JobSpec, cuda: bool | None = None) -> str:
    if not getattr(cfg, "NEEDS_DEVICE", True):
        return NO_DEVICE
    cuda = hardware.cuda_available() if cuda is None else cuda
    if not cuda:
        return "cpu"
    gpus = parallel.run_gpus(cfg, cuda)
    if gpus:
        return ",".join(f"gpu{g}" for g in gpus)
    return ALL_GPUS


def gpu_indices(devices: str) -> list[int] | None:
    """The GPU indices a device string names ("gpu0,gpu2" -> [0, 2]); None for every GPU ("gpu*", unknown)."""
    names = [d for d in devices.split(",") if d.startswith("gpu") and d[3:].isdigit()]
    return [int(d[3:]) for d in names] if names else None


def overlap(a: str, b: str) -> bool:
    """True when two device strings share a device ("gpu*" shares with any GPU set)."""
    left, right = set(filter(None, a.split(","))), set(filter(None, b.split(",")))
    if NO_DEVICE in left | right:
        return False  # a job that holds no device (a data recipe calls endpoints) shares with every job
    if not left or not right:
        return True  # unknown devices (a run recorded before device sets existed): assume they are shared
    if ALL_GPUS in left | right:
        return any(d.startswith("gpu") for d in left) and any(d.startswith("gpu") for d in right)
    return bool(left & right)


def startable(queued: list[tuple[str, str]], busy: list[str]) -> list[str]:
    """Ids of queued runs (``(id, devices)`` in queue order) that may start now next to ``busy`` devices."""
    claimed = list(busy)
    chosen = []
    for run_id, devices in queued:
        if not any(overlap(devices, other) for other in claimed):
            chosen.append(run_id)
        claimed.append(devices)  # started or waiting, later runs must not take its devices
    return chosen


class FileLock:
    """An exclusive ``flock`` on a file for a ``with`` block (the OS releases it if the process dies)."""

    def __init__(self, path: Path):
        self.path = path
        self._fh: IO | None = None

    def __enter__(self) -> "FileLock":
        self._fh = open(self.path, "w")
        fcntl.flock(self._fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._fh is not None
        self._fh.close()  # closing releases the lock
        self._fh = None


def start_lock() -> FileLock:
    """Held while a job is started or leaves the queue: two sessions (or two orchestrators after a hot
    reload, or the CLI next to the dashboard) can never both see the same devices as free."""
    return FileLock(paths.data_root() / ".start.lock")


def secret_values(names: list[str], given: dict[str, str] | None) -> dict[str, str]:
    """Values of the secret fields ``names`` for a run that starts later: the ones given (kept in
    memory while it was queued, or typed again), else the server's environment."""
    given = given or {}
    env = secrets.from_env(os.environ)
    return {name: given.get(name) or env.get(name, "") for name in names if name in env}


def config_when_due(run: RunRecord, store: Store, held: dict[str, str] | None,
                    holder: str) -> TrainConfig | JobSpec | None:
    """The config to launch a queued run with now that its devices are free, its secrets filled in from
    ``held`` (what this orchestrator, named ``holder``, keeps in memory) or the environment. None when the
    run is left to the orchestrator that holds its secrets, or when it cannot start (then it is failed, with
    the reason)."""
    if run.kind is not JobKind.TRAIN:
        return _spec_when_due(run, store)
    try:
        cfg = TrainConfig.from_yaml((paths.run_dir(run.id) / "config.yaml").read_text())
    except (OSError, ConfigError) as exc:
        store.finish_run(run.id, RunStatus.FAILED, error=f"its saved config cannot be read: {exc}")
        return None
    needed = list(run.needs_secrets)
    if needed and held is None and run.secrets_holder not in ("", holder) and adoption.holder_alive(run.secrets_holder):
        return None  # its secrets live in another orchestrator's memory: only that one can launch it
    cfg = dataclasses.replace(cfg, **secret_values(needed, held))
    missing = [name for name in needed if not getattr(cfg, name)]
    if missing:
        store.finish_run(run.id, RunStatus.FAILED, error=(
            f"This run was queued with {', '.join(missing)}, which is never written to disk; "
            f"{adoption.holder_gone(run.secrets_holder)} before its turn came. Start it again and enter the "
            f"secret, or set {secrets.ENV_NAMES} in the environment of the dashboard or CLI."))
        return None
    errors = cfg.validate() + loading.check_data(cfg)  # files may have changed or gone while it waited
    if errors:
        store.finish_run(run.id, RunStatus.FAILED, error="Invalid when its turn came: " +
                         "; ".join(str(e) for e in errors))
        return None
    return cfg


def _spec_when_due(run: RunRecord, store: Store) -> JobSpec | None:
    """The spec of a queued serve/eval/export job, checked again now that its turn came (its source run may
    have been deleted while it waited); None (and the job failed, with the reason) when it cannot start."""
    try:
        spec = read_spec(paths.run_dir(run.id))
    except ConfigError as exc:
        store.finish_run(run.id, RunStatus.FAILED, error=f"its job.json cannot be read: {exc}")
        return None
    try:
        errors = spec.validate()
    except Exception as exc:  # noqa: BLE001 - a spec no check foresaw fails this job alone; the queue moves on
        store.finish_run(run.id, RunStatus.FAILED, error=f"its job.json cannot be checked ({type(exc).__name__}: "
                                                         f"{exc}): submit the job again")
        return None
    if errors:
        store.finish_run(run.id, RunStatus.FAILED, error="Invalid when its turn came: " +
                         "; ".join(str(e) for e in errors))
        return None
    return spec
