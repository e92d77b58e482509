"""Compare: two to six runs side by side (loss overlays, summary table, config differences)."""
from __future__ import annotations

import streamlit as st

from trainer_core.charts import COMPARE_ALIGN, COMPARE_METRICS
from ui import format as fmt
from ui.compare import MAX_RUNS, MIN_RUNS, render_compare, run_labels
from ui.entry import require_entrypoint
from ui.state import get_orchestrator
from ui.views import stop_without_runs

require_entrypoint("pages/compare.py")

orch = get_orchestrator()
st.title("Compare runs")

RECENT = 100  # offered in the picker; runs named in the link are resolved by id, however old

runs = orch.list_runs(limit=RECENT)
stop_without_runs(runs)
asked = list(dict.fromkeys([*st.query_params.get_all("run"), *st.session_state.get("compare_ids", [])]))
runs += orch.get_runs([i for i in asked if i not in {r.id for r in runs}])
by_id = {r.id: r for r in runs}
labels = run_labels(runs)


def _remember_choice() -> None:
    chosen = st.session_state["compare_pick"]
    st.session_state["compare_ids"] = chosen
    st.query_params["run"] = chosen  # the URL names the runs: shareable, survives reload


# The URL wins (a shared link), then this session's last choice.
wanted = [i for i in st.query_params.get_all("run") if i in by_id] or \
    [i for i in st.session_state.get("compare_ids", []) if i in by_id]
if wanted and st.session_state.get("compare_pick") != wanted[:MAX_RUNS]:
    st.session_state["compare_pick"] = wanted[:MAX_RUNS]
if len(wanted) > MAX_RUNS:
    st.warning(f"{len(wanted)} runs were asked for; comparing the first {MAX_RUNS}.")
chosen = st.multiselect(
    "Runs", list(by_id), key="compare_pick", max_selections=MAX_RUNS, on_change=_remember_choice,
    format_func=lambda i: f"{labels[i]} · {fmt.status_badge(by_id[i].status)}",
    placeholder=f"Pick {MIN_RUNS} to {MAX_RUNS} runs",
)
if not MIN_RUNS <= len(chosen) <= MAX_RUNS:
    st.info(f"Pick {MIN_RUNS} to {MAX_RUNS} runs to compare ({len(chosen)} picked).")
    st.stop()

picked = [by_id[i] for i in chosen]
drawn = (*COMPARE_METRICS, *COMPARE_ALIGN)  # the overlays and the summary need no other column: read only these
render_compare(picked, {r.id: orch.metrics(r.id, columns=drawn) for r in picked},
               {r.id: orch.run_config(r.id) for r in picked})
