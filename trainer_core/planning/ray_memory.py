"""The memory a Ray worker can count on, for New run's estimate of a run on the cluster: the run's workers train
on the cluster's nodes, not on this host, so the estimate (trainer_core/planning/memory.py) is compared with the
GPU or RAM of the node that gives a worker the least. The nodes are read from Ray's dashboard
(trainer_core/launchers/ray_nodes.py); this module only decides. Dashboard-safe: no ray, no torch."""
from __future__ import annotations

import math
from dataclasses import dataclass

from trainer_core.planning.memory import DeviceMemory


@dataclass(frozen=True)
class NodeMemory:
    """One Ray node's devices as Ray's dashboard reports them (trainer_core/launchers/ray_nodes.py)."""
    node: str  # how it is named: its address and the start of its Ray node id
    cpus: float = 0.0
    gpu_count: float = 0.0  # GPUs in Ray's resources
    gpus: tuple[tuple[str, float, float], ...] = ()  # (name, free GB, total GB) per GPU Ray's reporter reads
    accelerator: str = ""  # Ray's accelerator_type resource of the node (e.g. "A100"), when set
    ram_free_gb: float = math.nan
    ram_total_gb: float = math.nan


def worker_memory(nodes: list[NodeMemory], gpus_per_worker: float, workers: int) -> DeviceMemory:
    """The memory one Ray worker can count on, on the node that gives it the least (Ray may place it on any
    node with room). GPU workers (``gpus_per_worker`` > 0) train on one GPU of a node with that many GPUs;
    fractional GPUs share one, each worker its share. CPU workers share a node's RAM with the other workers Ray
    puts there (one per CPU, at most ``workers``). NaN when the cluster does not report it."""
    if gpus_per_worker > 0:
        whole = math.ceil(gpus_per_worker - 1e-9)
        able = [n for n in nodes if n.gpu_count + 1e-9 >= whole]
        if not able:
            return DeviceMemory("cuda", f"a Ray worker's GPU (no node has {whole} GPU(s))", math.nan, math.nan)
        share = min(gpus_per_worker, 1.0)  # 0.5 GPU per worker: two workers on one GPU
        seen = [(free * share, total * share, name, n) for n in able for name, free, total in n.gpus]
        if not seen:
            kind = next((n.accelerator for n in able if n.accelerator), "")
            return DeviceMemory("cuda", f"a Ray worker's GPU{f' ({kind})' if kind else ''} on {able[0].node} (Ray's "
                                        "dashboard does not report its memory)", math.nan, math.nan)
        free, total, name, node = min(seen, key=lambda s: (s[0], s[1]))
        part = f", {share:g} of it per worker" if share < 1 else ""
        return DeviceMemory("cuda", f"{name} of Ray node {node.node}{part}", free, total)
    able = [n for n in nodes if n.cpus >= 1 and math.isfinite(n.ram_free_gb)]
    if not able:
        return DeviceMemory("cpu", "a Ray worker's RAM (Ray's dashboard does not report the nodes' memory)",
                            math.nan, math.nan)
    per_node = [(n.ram_free_gb / k, n.ram_total_gb / k, k, n) for n in able for k in [max(min(int(n.cpus), workers), 1)]]
    free, total, k, node = min(per_node, key=lambda s: (s[0], s[1]))
    shared = f", shared by {k} CPU workers" if k > 1 else ""
    return DeviceMemory("cpu", f"RAM of Ray node {node.node}{shared}", free, total)
