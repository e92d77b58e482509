"""Compare: two to six runs side by side (loss overlays, summary table, config differences)."""
from __future__ import annotations

import streamlit as st

from trainer_core.views.charts import COMPARE_ALIGN, COMPARE_METRICS
from trainer_core.views.run_rules import COMPARE_MAX, COMPARE_MIN, run_labels
from ui import format as fmt
from ui.compare import render_compare
from ui.samples import render_prompt_compare
from ui.entry import require_entrypoint
from ui.evaluation import render_eval_compare
from ui.state import get_orchestrator
from ui.views import other_metrics_picker, stop_without_runs

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
if wanted and st.session_state.get("compare_pick") != wanted[:COMPARE_MAX]:
    st.session_state["compare_pick"] = wanted[:COMPARE_MAX]
if len(wanted) > COMPARE_MAX:
    st.warning(f"{len(wanted)} runs were asked for; comparing the first {COMPARE_MAX}.")
chosen = st.multiselect(
    "Runs", list(by_id), key="compare_pick", max_selections=COMPARE_MAX, on_change=_remember_choice,
    format_func=lambda i: f"{labels[i]} · {fmt.status_badge(by_id[i].status)}",
    placeholder=f"Pick {COMPARE_MIN} to {COMPARE_MAX} runs",
)
if not COMPARE_MIN <= len(chosen) <= COMPARE_MAX:
    st.info(f"Pick {COMPARE_MIN} to {COMPARE_MAX} runs to compare ({len(chosen)} picked).")
    st.stop()

picked = [by_id[i] for i in chosen]
# Any metric key one of the runs logged besides the wide fields (rewards, accuracies...), overlaid on request
extra = other_metrics_picker("cmp", sorted({key for r in picked for key in orch.metric_keys(r.id)}))
drawn = (*COMPARE_METRICS, *COMPARE_ALIGN)  # the overlays and the summary need no other column: read only these
render_compare(picked, {r.id: orch.metrics(r.id, columns=drawn, keys=extra) for r in picked},
               {r.id: orch.run_config(r.id) for r in picked}, extra=extra)
render_prompt_compare(picked, labels, orch.sample_prompts([r.id for r in picked]),
                      lambda prompt: orch.prompt_samples([r.id for r in picked], prompt))
render_eval_compare(picked, orch.latest_eval_metrics([r.id for r in picked]))
