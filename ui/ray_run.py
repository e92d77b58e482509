"""Where an eval or export job runs (this host or the server's Ray cluster), and a run on the Ray cluster on Live
and Run details: its Ray job (with a link to the Ray dashboard's page of the
job, at an address this server may use), each rank's node (Ray node id, address, GPUs) once the workers are
placed, and how many times Ray Train restarted them after a lost worker (trainer_core/launchers/ray_record.py)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from trainer_core.config import server_cluster
from trainer_core.launchers import ray as ray_jobs
from trainer_core.launchers import ray_record
from ui.text import code


PLACES = {"local": "This host", "ray": "The Ray cluster"}


def job_place(key: str, what: str, more: str = "") -> tuple[str, float]:
    """("local" or "ray", GPUs on the node): where an eval or export job runs, offered when the server has a Ray
    cluster (the job is then a single-worker Ray job, its folder on the shared storage: docs/ray.md), and the GPUs
    Ray gives it there (a job that asks for none sees none on its node)."""
    if not server_cluster():  # eval and export jobs go to the server's own cluster
        return "local", 0.0
    cols = st.columns([2, 1])
    where = cols[0].radio("Where to run", list(PLACES), format_func=PLACES.get, horizontal=True, key=key,
                          help=f"The Ray cluster: the {what} runs as a single-worker Ray job on a node of the "
                               f"server's cluster, its files on the shared storage{more}")
    if where != "ray":
        return "local", 0.0
    gpus = cols[1].number_input("GPUs on the node (0: its CPU)", min_value=0.0, max_value=float(ray_jobs.RAY_GPUS_MAX),
                                step=1.0, key=key + "_gpus",
                                help="ray_gpus_per_worker: Ray places the job on a node with this many free GPUs")
    return "ray", float(gpus)


def ranks_frame(ranks: tuple[ray_record.RankPlace, ...]) -> pd.DataFrame:
    return pd.DataFrame([{"rank": r.rank, "node": r.node_id[:12], "address": r.address,
                          "GPUs": ", ".join(r.gpus) or "none"} for r in ranks],
                        columns=["rank", "node", "address", "GPUs"])


def render_ray(run_dir: Path) -> None:
    """Nothing for a run on this host."""
    record = ray_record.read_record(run_dir)
    if record is None:
        return
    restarts = f" · workers restarted {record.restarts}× after a lost worker" if record.restarts else ""
    cols = st.columns([5, 1])
    cols[0].caption(f"On the Ray cluster {code(ray_jobs.shown_address(record.address))} as job "
                    f"{code(record.job_id)}{restarts}")
    if record.dashboard:
        cols[1].link_button("Ray dashboard", record.dashboard, icon="🛰️")
    if record.ranks:
        st.dataframe(ranks_frame(record.ranks), hide_index=True, width="stretch")
