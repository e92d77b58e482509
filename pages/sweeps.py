"""Sweeps: a search's trials (settings, objective, outcome), the objective per trial with the best marked, parallel
coordinates, parameter importance; Stop, Resume and Extend; the best trial's run for evaluation, serving, export."""
from __future__ import annotations

import streamlit as st

from trainer_core.jobs.refusals import RunRefused
from trainer_core.sweeps import record
from trainer_core.sweeps.summary import summarize
from trainer_core.views.sweep_charts import importance_chart, objective_chart, parallel_chart
from trainer_core.views.run_rules import COMPARE_MAX
from ui.auth import current_actor
from ui.entry import require_entrypoint
from ui.state import get_orchestrator, get_sweeps
from ui.sweeps import chart_frame, header, sweep_label, trials_frame
from ui.text import code, safe

REFRESH_S = 2.0

require_entrypoint("pages/sweeps.py")

orch = get_orchestrator()
st.title("Sweeps")

ids = record.list_ids()
if not ids:
    st.info("No sweep yet. A sweep searches a run's settings with trials that are ordinary runs: start one with "
            "`python -m trainer_core sweep --config sweep.yaml` (docs/sweeps.md).")
    st.stop()
states = {i: record.read(i) for i in ids}


def _remember_choice() -> None:
    st.query_params["sweep"] = st.session_state["sweep_pick"]


wanted = st.query_params.get("sweep")
if wanted in states:
    st.session_state["sweep_pick"] = wanted
sweep_id = st.selectbox("Sweep", ids, format_func=lambda i: sweep_label(states[i]), key="sweep_pick",
                        on_change=_remember_choice)
actor = current_actor()
runner = get_sweeps()
state = states[sweep_id]

stop_col, resume_col, more_col, extend_col = st.columns([1, 1, 1, 1], vertical_alignment="bottom")
try:
    if stop_col.button("Stop sweep", disabled=state.status.value != "running",
                       help="Its running trials stop and save; queued ones leave the queue; nothing new starts."):
        runner.stop(sweep_id, actor=actor)
        st.rerun()
    if resume_col.button("Resume", disabled=state.status.value != "stopped",
                         help="Stopped trials continue from their checkpoints, then new ones start."):
        runner.resume(sweep_id, actor=actor)
        st.rerun()
    more = more_col.number_input("More trials", min_value=1, max_value=1000, value=4, step=1)
    if extend_col.button("Extend", disabled=state.status.value == "stopping",
                         help="Add trials to its budget (a completed or stopped sweep starts again)."):
        runner.resume(sweep_id, more_trials=int(more), actor=actor)
        st.rerun()
except RunRefused as exc:
    st.error(safe(exc))


@st.fragment(run_every=REFRESH_S if state.status.is_active() else None)
def sweep_view() -> None:
    summary = summarize(sweep_id, orch.store.sweep_runs(sweep_id))
    spec = summary.state.config.spec
    st.caption(safe(header(summary)))
    if not summary.trials:
        st.info("No trial has started yet.")
        return
    best = next((row for row in summary.trials if row["best"]), None)
    if best is not None:
        settings = ", ".join(f"{p} = {best[p]!r}" for p in summary.params)
        st.success(f"Best: trial {best['trial']}, {spec.objective} {best['objective']:.4g} with {safe(settings)} "
                   f"(run {code(best['run_id'])})")
        left, right = st.columns(2)
        if left.button("Open the best trial's run", help="Run details: evaluate, serve or export its model"):
            st.session_state["detail_run_id"] = best["run_id"]
            st.query_params.clear()
            st.switch_page("pages/run.py")
        if right.button("Compare the best trials", help=f"The {COMPARE_MAX} best finished trials on Compare"):
            ranked = sorted((r for r in summary.trials if r["objective"] is not None and r["run_id"]),
                            key=lambda r: r["objective"] if spec.direction == "minimize" else -r["objective"])
            st.session_state["compare_ids"] = [r["run_id"] for r in ranked[:COMPARE_MAX]]
            st.query_params.clear()
            st.switch_page("pages/compare.py")
    frame = chart_frame(summary)
    st.altair_chart(objective_chart(frame, spec.objective, spec.direction), use_container_width=True)
    charts = st.columns(2 if summary.importance else 1)
    if len(summary.params) > 0 and (frame["outcome"].isin(["completed", "pruned"])).any():
        charts[0].altair_chart(parallel_chart(frame, summary.params, spec.objective), use_container_width=True)
    if summary.importance:
        charts[1].altair_chart(importance_chart(summary.importance), use_container_width=True)
    st.dataframe(trials_frame(summary), hide_index=True, use_container_width=True,
                 column_config={"objective": st.column_config.NumberColumn(format="%.4g"),
                                "best": st.column_config.TextColumn("", width="small")})


sweep_view()

if state.status.value == "completed":
    with st.expander("Free disk: delete the other trials' checkpoints"):
        st.caption("Deletes the checkpoint folders of every trial run but the best one's. Their adapters, configs, "
                   "metrics and logs stay, and so do the runs in History; they can no longer be resumed.")
        sure = st.checkbox("Yes, delete them", key="sweep_free_sure")
        if st.button("Delete checkpoints", disabled=not sure):
            best_run = {row["run_id"] for row in summarize(sweep_id, orch.store.sweep_runs(sweep_id),
                                                           importance=False).trials if row["best"]}
            try:
                count, freed = runner.free_disk(sweep_id, keep=best_run, actor=actor)
                st.success(f"Deleted the checkpoints of {count} run(s): {freed / 1e6:.1f} MB freed.")
            except RunRefused as exc:
                st.error(safe(exc))
