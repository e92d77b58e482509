"""Run details: summary, timeline, config and full charts of one run, all read from the database."""
from __future__ import annotations

import json

import pandas as pd
import streamlit as st
import yaml

from trainer_core.views.charts import LOSS_KEYS, line_metrics
from trainer_core.protocol import paths
from trainer_core.protocol.metrics import WIDE_NAMES
from trainer_core.protocol.status import JobKind, RunStatus
from trainer_core.views.run_rules import run_name
from ui import data_recipes
from ui import format as fmt
from ui.auth import current_actor
from ui.entry import require_entrypoint
from ui.samples import render_samples, sampling_configured
from ui.evaluation import render_evaluation
from ui.export_panel import render_export
from ui.ray_run import render_ray
from ui.serve_panel import render_serve
from ui.state import get_orchestrator
from ui.text import code, safe
from ui.views import (chart_controls, other_keys, render_alerts, render_charts, render_nonfinite, render_outcome,
                      run_specs, status_markdown, stop_without_runs)

require_entrypoint("pages/run.py")

orch = get_orchestrator()
st.title("Run details")

RECENT = 100  # the picker offers the newest runs; any other run is reached by its id (History, a link)

runs = orch.list_runs(limit=RECENT)
stop_without_runs(runs)


def _remember_choice() -> None:
    st.session_state["detail_run_id"] = st.session_state["run_pick"]
    st.query_params["run"] = st.session_state["run_pick"]  # the URL names the run: shareable, survives reload


wanted = st.query_params.get("run") or st.session_state.get("detail_run_id")
if wanted and wanted not in {r.id for r in runs}:
    runs = orch.get_runs([wanted]) + runs  # an older run, resolved by its id
ids = [r.id for r in runs]
if wanted in ids:
    st.session_state["run_pick"] = wanted
elif wanted:
    st.warning("The run asked for does not exist (it may have been deleted); showing the newest run.")
labels = {r.id: fmt.run_choice(r) for r in runs}
run_id = st.selectbox("Run", ids, format_func=labels.get, key="run_pick", on_change=_remember_choice)
run = orch.get_run(run_id)
if run is None:
    st.warning(f"Run {safe(run_id)} no longer exists.")
    st.stop()
status = RunStatus(run.status)

st.markdown(f"### {safe(run_name(run))}")
st.markdown(status_markdown(status, "" if status.is_terminal() else run.phase)
            + f"  \n{safe(run.model)} · {safe(run.dataset)} · {safe(run.method)}"
            + (f" · engine: {safe(run.engine)}" if run.engine else "")
            + (f" · started by {safe(run.owner)}" if run.owner else ""))
if not status.is_terminal():
    if st.button("Watch live", icon="🏃"):
        st.session_state["live_run_id"] = run.id
        st.switch_page("pages/live.py")

started = run.started_at or run.created_at
cols = st.columns(6)
cols[0].metric("Steps", fmt.steps(run.steps_done, run.total_steps), border=True)
cols[1].metric("Final loss", fmt.number(run.final_loss if run.final_loss is not None else run.last_loss), border=True)
cols[2].metric("Best eval loss", fmt.number(run.best_eval_loss), border=True)
cols[3].metric("Tokens seen", fmt.compact(run.tokens_seen), border=True)
cols[4].metric("Duration", fmt.duration(run.finished_at - started if run.finished_at and started else None),
               border=True)
cols[5].metric("Started", fmt.ago(started), help=fmt.timestamp(started), border=True)

log_tail = orch.log_tail(run.id) if status is RunStatus.FAILED else ""
render_outcome(status, run.error, log_tail or run.log_tail, run.output_dir)
render_ray(paths.run_dir(run.id))  # a job on the Ray cluster: its Ray job, and each rank's node

notices = st.container()  # the non-finite warning and the alerts, once the metrics are read below
events = orch.events(run.id)
alerts = [e for e in events if e.kind == "alert"]
if run.parent_run_id and run.resumed_from_step is not None:  # an eval/serve/export job names its source run here too
    parent = orch.get_run(run.parent_run_id)
    st.caption(f"Resumed from **{safe(parent.name if parent else run.parent_run_id)}** at step {run.resumed_from_step}: "
               "the charts show that run's steps up to the checkpoint, then this run's.")

if run.kind is JobKind.TRAIN:  # lineage: the recipe and teacher behind a dataset a recipe made
    for line in data_recipes.lineage(orch.run_config(run.id)):
        st.caption(safe(line))
elif run.kind is JobKind.RECIPE:
    for version in data_recipes.published_by(run.id):
        trained = data_recipes.runs_trained_on(orch.store, version)
        st.caption(safe(f"Published {version.name}@v{version.version}: {version.card.get('kept')} rows kept of "
                        f"{version.card.get('made')} ({version.ref}); runs trained on it: "
                        + (", ".join(r.name or r.id for r in trained) or "none yet")))

charts_tab, timeline_tab, log_tab, config_tab, samples_tab, eval_tab, serve_tab, export_tab = st.tabs(
    ["Charts", "Timeline", "Worker log", "Config", "Samples", "Evaluation",
     "Endpoint" if run.kind is JobKind.SERVE else "Serve", "Artifacts" if run.kind is JobKind.EXPORT else "Export"])
with charts_tab:
    specs = run_specs(orch.run_config(run.id))  # the method's charts; any other key the run logged on request
    with st.expander("Chart options", icon="⚙️"):
        options = chart_controls("run", other_keys(orch.metric_keys(run.id), specs))
    # Only what the charts and the non-finite warning use, for the chosen x axis: a 100k-step run then
    # moves a fraction of its data. One read each.
    wall = ("wall_time",) if options.x == "elapsed_s" else ()  # wall time falls back on wall_time
    lines = line_metrics(specs, options.extra)
    drawn = (*LOSS_KEYS, *[k for k in lines if k in WIDE_NAMES], "nonfinite", options.x, *wall)
    earlier, own = orch.metrics_parts(run.id, columns=drawn, keys=[k for k in lines if k not in WIDE_NAMES])
    metrics = pd.concat([earlier, own], ignore_index=True) if len(earlier) else own
    render_charts(metrics, options, specs=specs)
    if not own.empty:  # the CSV (every column, this run's own rows) is read and built when the button is clicked
        st.download_button("Download metrics (CSV)", lambda: orch.metrics(run.id).to_csv(index=False),
                           file_name=f"{run.id}-metrics.csv", mime="text/csv", icon="⬇️")
with notices:
    render_nonfinite(metrics)
    render_alerts(alerts)
with timeline_tab:
    kinds = sorted({e.kind for e in events})
    shown = st.pills("Show", kinds, selection_mode="multi", default=kinds, key="run_timeline_kinds")
    rows = [{"time": fmt.timestamp(e.ts), "kind": e.kind, "message": e.message} for e in events if e.kind in shown]
    if rows:
        st.dataframe(rows, hide_index=True,
                     column_config={"message": st.column_config.TextColumn("message", width="large")})
    else:
        st.caption("No events recorded." if not events else "No events of the chosen kinds.")
with log_tab:
    log_text = orch.log_text(run.id)
    if not log_text:
        st.caption("No worker log (the run never started a worker, or its folder was deleted).")
    else:
        needle = st.text_input("Filter lines", key="run_log_filter", placeholder="e.g. warning, error, step",
                               help="Case-insensitive; shows matching lines from the whole log.")
        lines = log_text.splitlines()
        matching = [line for line in lines if needle.lower() in line.lower()] if needle else lines
        st.caption(f"{len(matching):,} of {len(lines):,} lines" + (" (last 400 shown)" if len(matching) > 400 else ""))
        st.code("\n".join(matching[-400:]) or "(no matching lines)", language="text")
        st.download_button("Download worker log", log_text, file_name=f"{run.id}-worker.log", mime="text/plain",
                           icon="⬇️")
with config_tab:
    config = orch.run_config(run.id)  # public config: secrets were never stored
    as_yaml = yaml.safe_dump(config, sort_keys=False)
    st.code(as_yaml, language="yaml")
    yaml_col, json_col, _ = st.columns([1, 1, 3])
    yaml_col.download_button("Download YAML", as_yaml, file_name=f"{run.id}.yaml", mime="application/x-yaml", icon="⬇️")
    json_col.download_button("Download JSON", json.dumps(config, indent=2), file_name=f"{run.id}.json",
                             mime="application/json", icon="⬇️")
    st.caption(f"Output folder: {code(run.output_dir)}" if run.output_dir else "No output folder.")


with samples_tab:  # samples during training: greedy answers to fixed prompts at sampling steps
    samples = orch.samples(run.id)
    if samples or sampling_configured(orch.run_config(run.id)):
        render_samples(samples, expected=not status.is_terminal())
        if not samples and status.is_terminal():
            st.caption("This run recorded no samples.")
    else:
        st.caption("This run asks no sample prompts (New run → Samples during training).")
with eval_tab:
    render_evaluation(orch, run, current_actor())
with serve_tab:
    render_serve(orch, run)
with export_tab:
    render_export(orch, run)
