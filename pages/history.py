"""History: every run in the database, newest first, a page at a time and searchable, with the queue,
resume, compare and delete."""
from __future__ import annotations

import math
import time

import pandas as pd
import streamlit as st

from trainer_core.auth.access import Action, allowed
from trainer_core.jobs.orchestrator import RunRefused
from trainer_core.protocol.status import JobKind, RunStatus
from trainer_core.views.run_rules import COMPARE_MAX, COMPARE_MIN, can_resume, run_name
from ui import format as fmt
from ui.auth import current_actor
from ui.entry import require_entrypoint
from ui.evaluation import headline as eval_headline
from ui.state import get_orchestrator
from ui.text import code, safe
from ui.views import stop_without_runs

require_entrypoint("pages/history.py")

PAGE_SIZE = 50

orch = get_orchestrator()
actor = current_actor()
st.title("History")

if not orch.count_runs():
    stop_without_runs([])

for message in st.session_state.pop("history_notices", []):
    st.toast(message)

# ---------------------------------------------------------------------- the queue
queue = orch.queue()
if queue:
    st.subheader(f"Queue ({len(queue)})")
    st.caption("Queued runs start by themselves, in this order, when the device they need is free.")
    for position, run in enumerate(queue, start=1):
        name_col, up_col, down_col, remove_col = st.columns([6, 1, 1, 1], vertical_alignment="center")
        name_col.markdown(f"**{position}.** {safe(run.name)} · {safe(run.model)} · {safe(run.method)}"
                          + (f" · {safe(run.owner)}" if run.owner else ""))
        mine = allowed(actor, Action.REORDER, run.owner)
        if up_col.button("Up", key=f"q_up_{run.id}", icon="⬆️", disabled=position == 1 or not mine, width="stretch"):
            orch.move_in_queue(run.id, -1, actor=actor)
            st.rerun()
        if down_col.button("Down", key=f"q_down_{run.id}", icon="⬇️", disabled=position == len(queue) or not mine,
                           width="stretch"):
            orch.move_in_queue(run.id, 1, actor=actor)
            st.rerun()
        if remove_col.button("Remove", key=f"q_remove_{run.id}", icon="✖️", width="stretch", disabled=not mine):
            orch.remove_from_queue(run.id, actor=actor)
            st.session_state["history_notices"] = [f"Removed '{safe(run.name)}' from the queue."]
            st.rerun()
    st.divider()

# ---------------------------------------------------------------------- the table
search_col, owner_col, kind_col, page_col, count_col = st.columns([3, 2, 2, 1, 2], vertical_alignment="bottom")
search = search_col.text_input("Search runs", key="history_search", placeholder="name, id, model, dataset or method")
owners = orch.run_owners()
shown_owners = owner_col.multiselect("Started by", owners, key="history_owners", placeholder="Everyone",
                                     help="Show only the runs these people started.") if owners else []
shown_kinds = kind_col.multiselect("Kind", list(JobKind), format_func=lambda k: k.label, key="history_kinds",
                                   placeholder="Every kind", help="Training runs, model servers, evaluations, exports.")
total = orch.count_runs(search, shown_owners, shown_kinds)
pages = max(1, math.ceil(total / PAGE_SIZE))
if st.session_state.get("history_page", 1) > pages:  # fewer matches than before: stay on a page that exists
    st.session_state["history_page"] = pages
page = page_col.number_input("Page", min_value=1, max_value=pages, step=1, key="history_page")
first = (page - 1) * PAGE_SIZE
runs = orch.list_runs(limit=PAGE_SIZE, offset=first, search=search, owners=shown_owners, kinds=shown_kinds)
count_col.caption(f"Runs {first + 1:,} to {first + len(runs):,} of {total:,}" if runs else "No run matches.")
by_id = {r.id: r for r in runs}
missing_parents = [r.parent_run_id for r in runs if r.parent_run_id and r.parent_run_id not in by_id]
names = {r.id: r.name for r in [*runs, *orch.get_runs(missing_parents)]}

sparklines = orch.sparklines(runs)
alerts = orch.alert_counts([r.id for r in runs])
latest_evals = orch.latest_eval_metrics([r.id for r in runs])
now = time.time()
table = pd.DataFrame([{
    "id": r.id,
    "name": run_name(r),
    "owner": r.owner,
    "status": fmt.status_badge(r.status, r.kind, r.phase),
    "alerts": f"⚠️ {alerts[r.id]}" if alerts.get(r.id) else "",
    "model": r.model,
    "dataset": r.dataset,
    "method": r.method,
    "started": fmt.to_datetime(r.started_at or r.created_at),
    "duration": fmt.duration((r.finished_at or now) - r.started_at if r.started_at else None),
    "steps": fmt.steps(r.steps_done, r.total_steps),
    "final loss": r.final_loss if r.final_loss is not None else r.last_loss,
    "best eval loss": r.best_eval_loss,
    "loss": sparklines.get(r.id, []),
    "resumed from": names.get(r.parent_run_id, r.parent_run_id or ""),
    "output": r.output_dir,
    "eval": eval_headline(latest_evals.get(r.id)),
} for r in runs], columns=["id", "name", "owner", "status", "alerts", "model", "dataset", "method", "started", "duration",
                          "steps", "final loss", "best eval loss", "loss", "resumed from", "output", "eval"])

st.dataframe(
    table,
    hide_index=True,
    column_order=["name", "owner", "status", "alerts", "model", "dataset", "method", "started", "duration", "steps",
                  "final loss", "best eval loss", "loss", "eval", "resumed from", "output"],
    column_config={
        "name": st.column_config.TextColumn("Name", pinned=True),
        "owner": st.column_config.TextColumn("Started by"),
        "status": st.column_config.TextColumn("Status"),
        "alerts": st.column_config.TextColumn("Alerts", help="Training-health alerts (NaN/inf, grad-norm spikes, "
                                                             "rising eval loss); see the run's timeline"),
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
        "resumed from": st.column_config.TextColumn("Resumed from"),
        "output": st.column_config.TextColumn("Output folder"),
        "eval": st.column_config.TextColumn("Latest eval", help="The newest completed evaluation of the run's model "
                                                                "(Run details > Evaluation)"),
    },
)

# ---------------------------------------------------------------------- one run: open, resume, delete
if not runs:
    st.stop()
if st.session_state.get("history_pick") not in by_id:
    st.session_state.pop("history_pick", None)  # picked on another page of the list
# Runs picked for Compare on other pages of the list stay picked (and labelled).
kept = [i for i in st.session_state.get("history_compare", []) if i not in by_id]
labelled = runs + orch.get_runs(kept)
labels = {r.id: fmt.run_choice(r) for r in labelled}
pick_col, open_col, resume_col, delete_col = st.columns([4, 1, 1, 1], vertical_alignment="bottom")
chosen = pick_col.selectbox("Run", list(by_id), format_func=labels.get, key="history_pick")
run = by_id[chosen]
status = RunStatus(run.status)
if open_col.button("Open", icon="🔎", type="primary", width="stretch"):
    st.session_state["detail_run_id"] = chosen
    st.switch_page("pages/run.py", query_params={"run": chosen})
if resume_col.button("Resume", icon="⏯️", width="stretch",
                     disabled=not can_resume(status) or not allowed(actor, Action.RESUME, run.owner),
                     help="Continue from this run's latest checkpoint as a new, linked run "
                          "(stopped, failed or cancelled runs with a saved checkpoint)."):
    st.session_state["history_resume"] = chosen
if delete_col.button("Delete", icon="🗑️", width="stretch",
                     disabled=not status.is_terminal() or not allowed(actor, Action.DELETE, run.owner),
                     help="Remove the run from History (asks first). Active and queued runs cannot be deleted."):
    st.session_state["history_delete"] = chosen

if st.session_state.get("history_resume") == chosen:
    needed = list(run.needs_secrets)
    with st.container(border=True):
        st.markdown(f"**Resume '{safe(run.name)}'** from its latest checkpoint?")
        secrets = {}
        if "hf_token" in needed:
            secrets["hf_token"] = st.text_input("HF token (this run used one; it is never stored)", type="password",
                                                key="history_resume_hf_token")
        if "wandb_token" in needed:
            secrets["wandb_token"] = st.text_input("W&B key (this run used one; it is never stored)",
                                                   type="password", key="history_resume_wandb_token")
        go_col, no_col, _ = st.columns([1, 1, 4])
        if go_col.button("Resume now", type="primary", key="history_resume_go"):
            try:
                new_id = orch.resume(chosen, secrets={k: v for k, v in secrets.items() if v}, actor=actor)
            except RunRefused as exc:
                st.error(safe(exc), icon="🚫")
            else:
                st.session_state.pop("history_resume", None)
                new = orch.get_run(new_id)
                if new.status == RunStatus.QUEUED.value:
                    st.session_state["history_notices"] = [f"'{safe(new.name)}' is queued; it starts when the device is free."]
                    st.rerun()
                st.session_state["live_run_id"] = new_id
                st.switch_page("pages/live.py")
        if no_col.button("Not now", key="history_resume_cancel"):
            st.session_state.pop("history_resume", None)
            st.rerun()

if st.session_state.get("history_delete") == chosen:
    with st.container(border=True):
        st.warning(f"Delete **{safe(run.name)}** from History? Its metrics and timeline are removed from the database.",
                   icon="⚠️")
        with_files = st.checkbox(f"Also delete its folder (checkpoints, adapter, logs): {code(run.output_dir)}",
                                 key="history_delete_files")
        yes_col, no_col, _ = st.columns([1, 1, 4])
        if yes_col.button("Yes, delete", type="primary", key="history_delete_yes"):
            try:
                orch.delete_run(chosen, delete_files=with_files, actor=actor)
            except RunRefused as exc:
                st.error(safe(exc), icon="🚫")
            else:
                st.session_state.pop("history_delete", None)
                st.session_state.pop("history_pick", None)
                st.session_state["history_notices"] = [f"Deleted '{safe(run.name)}'" + (" and its files." if with_files else ".")]
                st.rerun()
        if no_col.button("Keep it", key="history_delete_no"):
            st.session_state.pop("history_delete", None)
            st.rerun()

# ---------------------------------------------------------------------- compare
st.divider()
compare_col, go_col = st.columns([5, 1], vertical_alignment="bottom")
picked = compare_col.multiselect(f"Compare runs ({COMPARE_MIN} to {COMPARE_MAX}, from any page)", list(labels),
                                 format_func=labels.get, key="history_compare", max_selections=COMPARE_MAX)
if go_col.button("Compare", icon="⚖️", width="stretch", disabled=len(picked) < COMPARE_MIN):
    st.session_state["compare_ids"] = picked
    st.switch_page("pages/compare.py", query_params={"run": picked})
