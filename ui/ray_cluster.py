"""The Ray cluster on the dashboard's pages: what Settings' "Ray cluster" section (ui/ray_settings.py) shows of a
check (nodes, capacity and the shared-storage probe) and New run's "Where to run" (this host or the cluster,
workers and GPUs per worker, the cluster's capacity). The cluster is asked through trainer_core/launchers/ray.py,
which imports ray only when a cluster is asked, never at import time. The addresses are the server's environment
(RAY_ADDRESS, FINETUNE_STUDIO_RAY_ADDRESSES) and the one an admin saved in Settings: a run may use only those
(config ``ray_address_problem``)."""
from __future__ import annotations

import os

import pandas as pd
import streamlit as st

from trainer_core.config import RAY_ADDRESS_ENV, SHARED_STORAGE_ENV, TrainConfig, ray_address_problem
from trainer_core.launchers import ray as ray_jobs, ray_nodes
from trainer_core.planning.memory import DeviceMemory
from trainer_core.planning.ray_memory import NodeMemory
from ui.form import K
from ui.text import safe

CHECK = "settings_ray_check"  # session key: the last "Check cluster" result (a ray_jobs.ClusterCheck)
CAPACITY_TTL_S = 15  # New run asks the cluster at most this often (each rerun of the form would ask again)
PLACES = {"local": "This host", "ray": "The Ray cluster"}
HOW_TO = (f"set `{RAY_ADDRESS_ENV}` to the cluster's dashboard address (e.g. `http://head:8265`) and "
          f"`{SHARED_STORAGE_ENV}` to a path every node mounts, with `FINETUNE_STUDIO_HOME` under it, in the "
          "server's environment, then restart the dashboard (docs/ray.md)")


def nodes_frame(nodes: tuple[ray_jobs.RayNode, ...], probed: bool = False) -> pd.DataFrame:
    """One row per node: id, address, CPUs and GPUs (free of total), and after a check whether it sees the
    shared storage."""
    def free_of(free: float | None, total: float) -> str:
        return f"{'?' if free is None else f'{free:g}'} of {total:g}"

    rows = [{"node": n.node_id[:12] + (" (head)" if n.head else ""), "address": n.address,
             "CPUs free": free_of(n.free_cpus, n.cpus), "GPUs free": free_of(n.free_gpus, n.gpus),
             **({"shared storage": "sees it" if not n.shared else f"cannot see it: {n.shared}"} if probed else {})}
            for n in nodes]
    return pd.DataFrame(rows, columns=["node", "address", "CPUs free", "GPUs free", *(["shared storage"] if probed else [])])


def capacity_line(info: ray_jobs.ClusterInfo) -> str:
    """"2 nodes · GPUs: 1 free of 4 · CPUs: 6 free of 16" (free unknown: '?')."""
    def free(what: str) -> str:
        return f"{info.total(what):g}" if all(getattr(n, what) is not None for n in info.nodes) else "?"

    return (f"{len(info.nodes)} node(s) · GPUs: {free('free_gpus')} free of {info.total('gpus'):g} · "
            f"CPUs: {free('free_cpus')} free of {info.total('cpus'):g}")


def own_and_other_addresses(addresses: list[str]) -> tuple[str, list[str]]:
    """(the server's own cluster, RAY_ADDRESS, or ""; the other allowed ones) of ``server_addresses()``."""
    own = os.environ.get(RAY_ADDRESS_ENV, "").strip().rstrip("/")
    return own, [a for a in addresses if a != own]


# ---------------------------------------------------------------------- Settings (ui/ray_settings.py)
def show_check(check: ray_jobs.ClusterCheck) -> None:
    info = check.info
    if info.problem:
        st.error(safe(info.problem), icon="🛰️")
    else:
        st.success(f"The Ray cluster at {safe(ray_jobs.shown_address(info.address))} answers: {capacity_line(info)}.",
                   icon="✅")
        st.dataframe(nodes_frame(info.nodes, probed=bool(check.shared) and all(n.shared is not None for n in info.nodes)),
                     hide_index=True, width="stretch")
    for problem in check.problems:
        if problem != info.problem:
            st.error(safe(problem))
    if not check.problems:
        st.success(f"Every node sees the shared storage {safe(check.shared)}: run folders there work on the cluster.",
                   icon="✅")


# ---------------------------------------------------------------------- New run
@st.cache_data(ttl=CAPACITY_TTL_S, max_entries=8, show_spinner="Asking the Ray cluster...")
def cached_cluster_info(address: str) -> ray_jobs.ClusterInfo:
    return ray_jobs.cluster_info(address)


def where_to_run(help_text=TrainConfig.help) -> None:
    """This host or the Ray cluster (only offered when the server has one), the number of processes (Ray
    workers) and the GPUs per worker, and the cluster's nodes and free capacity."""
    st.subheader("Where to run")
    state = st.session_state
    addresses = ray_jobs.server_addresses()
    if addresses:
        st.radio("Where to run", list(PLACES), format_func=PLACES.get, key=K + "launcher", horizontal=True,
                 help=help_text("launcher"), label_visibility="collapsed")
    elif state.get(K + "launcher") == "ray":
        st.warning("This config runs on a Ray cluster, but the server has none: " + HOW_TO + ".", icon="🛰️")
    else:
        st.caption("Runs on this host. To offer a Ray cluster here, " + HOW_TO + ".")
    on_ray = state.get(K + "launcher") == "ray"
    cols = st.columns(3)
    cols[0].number_input("Ray workers (0 or 1: one)" if on_ray else "Processes (0: one per GPU)", min_value=0, step=1,
                         key=K + "num_processes", help=help_text("num_processes"))
    if not on_ray:
        return
    if isinstance(state.get(K + "ray_gpus_per_worker"), int):  # "1" in a YAML file: the widget holds floats
        state[K + "ray_gpus_per_worker"] = float(state[K + "ray_gpus_per_worker"])
    cols[1].number_input("GPUs per worker (0: CPU workers)", min_value=0.0, step=1.0, key=K + "ray_gpus_per_worker",
                         help=help_text("ray_gpus_per_worker"))
    own, others = own_and_other_addresses(addresses)
    if not own and not state.get(K + "ray_address") and others:
        state[K + "ray_address"] = others[0]  # no cluster of the server's own: the first one allowed
    current = state.get(K + "ray_address", "")
    if others or current:  # "" is the server's own cluster (RAY_ADDRESS), offered when there is one
        options = list(dict.fromkeys([*([""] if own else []), *others, *([current] if current else [])]))
        cols[2].selectbox("Cluster", options, key=K + "ray_address", help=help_text("ray_address"),
                          format_func=lambda a: ray_jobs.shown_address(a or own) + ("" if a else " (the server's)"))
    # No max_value: a preset above the limit is shown as it is, and validation names the field and the limit.
    st.columns(3)[0].number_input("Restarts when a worker or node is lost (0: the run fails)", min_value=0, step=1,
                                  key=K + "ray_max_failures", help=help_text("ray_max_failures"))
    capacity_panel(state.get(K + "ray_address", "") or own,
                   int(state.get(K + "num_processes") or 1), float(state.get(K + "ray_gpus_per_worker") or 0.0))


@st.cache_data(ttl=CAPACITY_TTL_S, max_entries=8, show_spinner="Asking the Ray cluster for its nodes' memory...")
def cached_cluster_memory(address: str) -> tuple[list[NodeMemory], str]:
    return ray_nodes.cluster_memory(address)


def worker_device(cfg: TrainConfig) -> tuple[str, DeviceMemory]:
    """New run's memory estimate of a run on the cluster is for one Ray worker's device: "cuda" or "cpu" and the
    GPU or RAM of the node that gives a worker the least (its label names the node and the GPU)."""
    address = ray_nodes.run_address(cfg)
    nodes, problem = cached_cluster_memory(address) if address else ([], "no cluster this server may use")
    return ray_nodes.worker_device(cfg, nodes, problem)


def capacity_panel(address: str, workers: int, gpus_per_worker: float) -> None:
    if not address:
        return  # validation names it: launcher: ray needs the cluster's address
    refused = ray_address_problem(address)
    if refused:
        st.warning(safe(refused), icon="🛰️")
        return
    info = cached_cluster_info(address)
    if info.problem:
        st.warning(f"The Ray cluster does not answer, so its capacity is unknown: {safe(info.problem)}. The run "
                   "can still be started; Ray places it when the cluster is back.", icon="🛰️")
        return
    st.caption(f"Ray cluster {safe(address)}: {capacity_line(info)}")
    st.dataframe(nodes_frame(info.nodes), hide_index=True, width="stretch")
    needed = workers * gpus_per_worker
    free = info.total("free_gpus") if all(n.free_gpus is not None for n in info.nodes) else None
    if needed and free is not None and needed > free:
        st.warning(f"This run needs {needed:g} GPU(s) ({workers} worker(s) × {gpus_per_worker:g}); {free:g} are free "
                   "now: it waits on the cluster until Ray can place it.", icon="⏳")
