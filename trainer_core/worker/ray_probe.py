"""The shared-storage probe of a Ray cluster (trainer_core/launchers/ray.py ``check_cluster``), run as a Ray job:
``python -m trainer_core.worker.ray_probe FOLDER``. One task pinned to each alive node writes a file named after
its node into FOLDER (under the shared storage) and reads it back; the dashboard then looks for every node's file
from its own side, which proves the node and the dashboard see the same storage. No ML stack here."""
from __future__ import annotations

import sys
from pathlib import Path


def write_and_read(folder: str, node_id: str) -> str:
    """On the node: "" when its file could be written and read back under ``folder``, else why not."""
    path = Path(folder) / node_id
    try:
        path.write_text(node_id)
        return "" if path.read_text() == node_id else "the file read back differs"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def main(argv: list[str]) -> int:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if len(argv) != 2:
        print("usage: python -m trainer_core.worker.ray_probe FOLDER", file=sys.stderr)
        return 2
    ray.init()
    probe = ray.remote(num_cpus=0)(write_and_read)
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    answers = ray.get([probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                       .remote(argv[1], node) for node in nodes])
    for node, problem in zip(nodes, answers):
        print(f"{node}: {problem or 'ok'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
