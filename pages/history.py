"""History: every run in the database, newest first, with a loss sparkline each."""
from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from ui import format as fmt
from ui.entry import require_entrypoint
from ui.state import get_orchestrator
from ui.views import stop_without_runs

require_entrypoint("pages/history.py")

orch = get_orchestrator()
st.title("History")

runs = orch.list_runs()
stop_without_runs(runs)

sparklines = orch.loss_series([r.id for r in runs])
now = time.time()
table = pd.DataFrame([{
    "id": r.id,
    "name": r.name or r.id,
    "status": fmt.status_badge(r.status),
    "model": r.model,
    "dataset": r.dataset,
    "method": r.method,
    "started": fmt.to_datetime(r.started_at or r.created_at),
    "duration": fmt.duration((r.finished_at or now) - r.started_at if r.started_at else None),
    "steps": fmt.steps(r.steps_done, r.total_steps),
    "final loss": r.final_loss if r.final_loss is not None else r.last_loss,
    "best eval loss": r.best_eval_loss,
    "loss": sparklines.get(r.id, []),
    "output": r.output_dir,
} for r in runs])

st.dataframe(
    table,
    hide_index=True,
    column_order=["name", "status", "model", "dataset", "method", "started", "duration", "steps", "final loss",
                  "best eval loss", "loss", "output"],
    column_config={
        "name": st.column_config.TextColumn("Name", pinned=True),
        "status": st.column_config.TextColumn("Status"),
        "model": st.column_config.TextColumn("Model"),
        "dataset": st.column_config.TextColumn("Dataset"),
        "method": st.column_config.TextColumn("Method"),
        "started": st.column_config.DatetimeColumn("Started", format="YYYY-MM-DD HH:mm"),
        "duration": st.column_config.TextColumn("Duration"),
        "steps": st.column_config.TextColumn("Steps", help="Steps done / total steps"),
        "final loss": st.column_config.NumberColumn("Final loss", format="%.4f",
                                                    help="Last train loss (still changing while a run is active)"),
        "best eval loss": st.column_config.NumberColumn("Best eval loss", format="%.4f"),
        "loss": st.column_config.LineChartColumn("Loss", width="medium"),
        "output": st.column_config.TextColumn("Output folder"),
    },
)

labels = {r.id: f"{r.name or r.id} · {fmt.status_badge(r.status)} · {fmt.timestamp(r.created_at)}" for r in runs}
pick_col, open_col = st.columns([4, 1], vertical_alignment="bottom")
chosen = pick_col.selectbox("Run", list(labels), format_func=labels.get, key="history_pick")
if open_col.button("Open", icon="🔎", type="primary", width="stretch"):
    st.session_state["detail_run_id"] = chosen
    st.switch_page("pages/run.py", query_params={"run": chosen})
