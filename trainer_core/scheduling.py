"""Which runs may train at the same time.

Devices: a run on a CPU host holds "cpu"; on a GPU host it holds the GPUs in ``gpu_ids`` ("gpu0,gpu1"),
or every visible GPU ("gpu*") when none are named. Two runs whose device sets overlap never train at the
same time. The queue is first come, first served with backfill: a queued run may start before an earlier
one only when it overlaps neither the running runs nor any earlier queued run (so nobody starves).
"""
from __future__ import annotations

from trainer_core import hardware, parallel
from trainer_core.config import TrainConfig

ALL_GPUS = "gpu*"


def devices_of(cfg: TrainConfig, cuda: bool | None = None) -> str:
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

