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


def job_place(key: str, what: str, more: str = "") -> str:
    """"local" or "ray": where an eval or export job runs, offered when the server has a Ray cluster (the job is
    then a single-worker Ray job, its folder on the shared storage: docs/ray.md)."""
    if not server_cluster():  # eval and export jobs go to the server's own cluster
        return "local"
    return st.radio("Where to run", list(PLACES), format_func=PLACES.get, horizontal=True, key=key,
                    help=f"The Ray cluster: the {what} runs as a single-worker Ray job on a node of the server's "
                         f"cluster, its files on the shared storage{more}")


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
