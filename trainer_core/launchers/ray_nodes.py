"""The memory of a Ray cluster's nodes, for the estimate of a run on the cluster (trainer_core/planning/
ray_memory.py): read from Ray's dashboard, whose reporter agent on every node reads its RAM (psutil) and GPUs
(NVML: name, memory total and used) a few times a minute. No job is submitted and ray is not imported: one
HTTP request (``/nodes?view=summary``, the same answer as the per-node usage ``ray_waiting.node_usage`` reads)."""
from __future__ import annotations

import json
import math
import urllib.request
from typing import Any

from trainer_core.config import TrainConfig, ray_address_problem, server_cluster
from trainer_core.planning.memory import GB, DeviceMemory
from trainer_core.planning.ray_memory import NodeMemory, worker_memory

MIB = 1024 * 1024  # Ray's reporter gives GPU memory in MiB
ACCELERATOR = ("accelerator_type:", "acceleratorType:")  # Ray's resource name, as sent and camelCased by its REST


def cluster_memory(address: str, timeout_s: float = 10.0) -> tuple[list[NodeMemory], str]:
    """The alive nodes' memory, or ([], why it could not be read)."""
    try:
        with urllib.request.urlopen(f"{address.rstrip('/')}/nodes?view=summary", timeout=timeout_s) as reply:
            summary = json.loads(reply.read())["data"]["summary"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        from trainer_core.launchers.ray import redacted, shown_address  # its address check, shown without a password

        return [], (f"{shown_address(address)} did not report its nodes' memory ({type(exc).__name__}: "
                    f"{redacted(str(exc), address)[:200]})")
    return nodes_memory(summary if isinstance(summary, list) else []), ""


def nodes_memory(summary: list[dict[str, Any]]) -> list[NodeMemory]:
    """NodeMemory of each alive node in Ray's node summary (``mem``: [total, available, percent, used] bytes;
    ``gpus``: one entry per GPU with ``name``, ``memoryTotal`` and ``memoryUsed`` in MiB; ``raylet``: the node's
    id, address, state and total resources)."""
    found = []
    for entry in summary:
        raylet = entry.get("raylet") or {}
        if raylet.get("state", "ALIVE") != "ALIVE":
            continue
        resources = raylet.get("resourcesTotal") or raylet.get("resources_total") or {}
        accelerator = next((name.split(":", 1)[1] for name in resources if name.startswith(ACCELERATOR)), "")
        mem = entry.get("mem") or []
        ram_total, ram_free = (mem[0] / GB, mem[1] / GB) if len(mem) >= 2 else (math.nan, math.nan)
        gpus = []
        for gpu in entry.get("gpus") or []:
            total = float(gpu.get("memoryTotal", gpu.get("memory_total")) or 0) * MIB / GB
            used = float(gpu.get("memoryUsed", gpu.get("memory_used")) or 0) * MIB / GB
            if total:
                gpus.append((str(gpu.get("name") or "GPU"), max(total - used, 0.0), total))
        address = raylet.get("nodeManagerAddress") or entry.get("ip") or "?"
        found.append(NodeMemory(f"{address} ({str(raylet.get('nodeId', ''))[:12]})", float(resources.get("CPU", 0)),
                                float(resources.get("GPU", 0)), tuple(gpus), accelerator, ram_free, ram_total))
    return found


def run_address(cfg: TrainConfig) -> str:
    """The cluster a run goes to (as the launcher picks it: its ray_address, else the server's cluster: RAY_ADDRESS
    or the one saved in Settings); "" when none, or when the server does not allow it (never asked then)."""
    address = cfg.ray_address.strip() or server_cluster()
    return address if address and not ray_address_problem(address) else ""


def worker_device(cfg: TrainConfig, nodes: list[NodeMemory], problem: str = "") -> tuple[str, DeviceMemory]:
    """("cuda" or "cpu", the memory one of the run's Ray workers can count on) from the cluster's ``nodes``;
    unknown (NaN) with ``problem`` when they could not be read."""
    device = "cuda" if cfg.ray_gpus_per_worker > 0 else "cpu"
    if problem:
        what = "GPU" if device == "cuda" else "RAM"
        return device, DeviceMemory(device, f"a Ray worker's {what} ({problem})", math.nan, math.nan)
    return device, worker_memory(nodes, cfg.ray_gpus_per_worker, max(cfg.num_processes, 1))


def run_worker_device(cfg: TrainConfig, timeout_s: float = 5.0) -> tuple[str, DeviceMemory]:
    """``worker_device`` of a run, asking its cluster now (the check before a start; New run caches the nodes)."""
    address = run_address(cfg)
    nodes, problem = cluster_memory(address, timeout_s) if address else ([], "no cluster this server may use")
    return worker_device(cfg, nodes, problem)
