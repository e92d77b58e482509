"""A sweep's durable record: its folder under the data root, ``sweeps/<id>/``.

* ``sweep.yaml`` -- the base run config (no secrets) and its ``sweep:`` section, as started;
* ``state.jsonl`` -- who started it and when, then each status change (running, stopping, stopped, completed)
  and each extension of its trial budget, one JSON line each (read like a run's journal: a torn line is skipped);
* ``study.log`` -- the Optuna study (JournalStorage): every trial's parameters, evaluations and outcome;
* ``driver.lock`` -- held (flock) by the one process driving the sweep.

The trials are ordinary runs whose rows carry the sweep id and trial number (their journals restore both on
``db rebuild``), so the database holds nothing of a sweep that this folder and the run folders do not.
"""
from __future__ import annotations

import json
import os
import secrets as pysecrets
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from trainer_core.config import load_yaml
from trainer_core.protocol import paths
from trainer_core.protocol.paths import RUN_ID_RE, UnsafePathError
from trainer_core.sweeps.spec import SweepConfig

CONFIG_FILE, STATE_FILE, STUDY_FILE, LOCK_FILE = "sweep.yaml", "state.jsonl", "study.log", "driver.lock"


class SweepStatus(StrEnum):
    RUNNING = "running"  # trials are started until the budget is spent
    STOPPING = "stopping"  # its running trials are stopping (they save); nothing new starts
    STOPPED = "stopped"  # stopped by a person: resume continues the stopped trials, then starts new ones
    COMPLETED = "completed"  # the budget is spent and every trial has ended: extend it to run more

    def is_active(self) -> bool:
        return self in (SweepStatus.RUNNING, SweepStatus.STOPPING)


@dataclass(frozen=True)
class SweepState:
    id: str
    name: str
    owner: str
    role: str
    created_at: float
    status: SweepStatus
    n_trials: int | None  # the spec's trial count, or the last extension's (SweepSpec.trial_budget reads it)
    running_s: float  # time spent running (the time budget counts only this)
    config: SweepConfig
    folder: Path


def sweeps_dir() -> Path:
    return paths.data_root() / "sweeps"


def sweep_dir(sweep_id: str) -> Path:
    if not RUN_ID_RE.fullmatch(sweep_id):
        raise UnsafePathError(f"sweep id {sweep_id!r} has characters that are not allowed")
    return sweeps_dir() / sweep_id


def create(config: SweepConfig, owner: str, role: str, name: str = "") -> str:
    """Write a new sweep's folder (status running) and return its id."""
    sweep_id = "sweep-" + time.strftime("%Y%m%d-%H%M%S") + "-" + pysecrets.token_hex(3)
    folder = sweep_dir(sweep_id)
    folder.mkdir(parents=True)
    (folder / CONFIG_FILE).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    _append(folder, {"op": "create", "owner": owner, "role": role, "name": name or config.spec.name or sweep_id,
                     "n_trials": config.spec.n_trials})
    _append(folder, {"op": "status", "status": SweepStatus.RUNNING.value})
    return sweep_id


def set_status(sweep_id: str, status: SweepStatus, note: str = "") -> None:
    _append(sweep_dir(sweep_id), {"op": "status", "status": status.value, "note": note})


def extend(sweep_id: str, n_trials: int) -> None:
    """Raise the sweep's trial budget to ``n_trials`` in all."""
    _append(sweep_dir(sweep_id), {"op": "extend", "n_trials": int(n_trials)})


def read(sweep_id: str) -> SweepState:
    """The sweep's state from its folder. FileNotFoundError when there is no such sweep."""
    folder = sweep_dir(sweep_id)
    data = load_yaml((folder / CONFIG_FILE).read_text(encoding="utf-8")) or {}
    config, _ = SweepConfig.from_mapping(data) if isinstance(data, dict) else (SweepConfig(), [])
    created = {"owner": "", "role": "viewer", "name": sweep_id, "ts": 0.0}
    status, n_trials, running_s, since = SweepStatus.RUNNING, config.spec.n_trials, 0.0, None
    for record in _records(folder):
        if record["op"] == "create":
            created = {**created, **record}
            n_trials = record.get("n_trials", n_trials)
        elif record["op"] == "extend":
            n_trials = int(record["n_trials"])
        elif record["op"] == "status":
            try:
                new = SweepStatus(record.get("status"))
            except ValueError:
                continue
            if since is not None:
                running_s += record["ts"] - since
            since = record["ts"] if new is SweepStatus.RUNNING else None
            status = new
    if since is not None:
        running_s += time.time() - since
    return SweepState(id=sweep_id, name=str(created["name"]), owner=str(created["owner"]), role=str(created["role"]),
                      created_at=float(created["ts"]), status=status, n_trials=n_trials, running_s=running_s,
                      config=config, folder=folder)


def status(sweep_id: str) -> SweepStatus:
    """The sweep's status from its state journal alone (the runner asks it of every sweep each second)."""
    found = SweepStatus.RUNNING
    for record in _records(sweep_dir(sweep_id)):
        if record["op"] == "status" and record.get("status") in _STATUSES:
            found = SweepStatus(record["status"])
    return found


_STATUSES = frozenset(s.value for s in SweepStatus)


def list_ids() -> list[str]:
    """Every sweep's id, newest first."""
    root = sweeps_dir()
    if not root.is_dir():
        return []
    return sorted((p.name for p in root.iterdir() if (p / STATE_FILE).is_file() and RUN_ID_RE.fullmatch(p.name)),
                  reverse=True)


def _append(folder: Path, record: dict[str, Any]) -> None:
    line = json.dumps({**record, "ts": time.time()}, sort_keys=True) + "\n"
    with open(folder / STATE_FILE, "a", encoding="utf-8") as fh:  # one write per line: appends never interleave
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def _records(folder: Path) -> list[dict[str, Any]]:
    try:
        data = (folder / STATE_FILE).read_bytes()
    except FileNotFoundError:
        return []
    records = []
    for raw in data.split(b"\n"):
        try:
            record = json.loads(raw.decode("utf-8", errors="replace"))
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("op"), str) and isinstance(record.get("ts"), (int, float)):
            records.append(record)
    return records
