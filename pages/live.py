"""Live view: the run chosen in this session, else the active run, else the most recent one."""
from __future__ import annotations

import streamlit as st

from trainer_core.auth.access import Action, allowed
from trainer_core.jobs.orchestrator import RunRefused
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus
from ui.auth import current_actor
from ui.entry import require_entrypoint
from ui.ray_run import render_ray
from ui.samples import render_samples, sampling_configured
from ui.state import get_orchestrator
from ui.text import safe
from ui.views import chart_controls, render_live, run_specs

require_entrypoint("pages/live.py")

REFRESH_S = 1.0

orch = get_orchestrator()


def _chosen_run_id() -> str | None:
    """This session's run, else the active one (so any browser sees it), else the most recent one."""
    for candidate in (st.session_state.get("live_run_id"), orch.active_run_id()):
        if candidate and orch.get_run(candidate) is not None:
            return candidate
    runs = orch.list_runs(limit=1, kinds=[JobKind.TRAIN])  # serve/eval/export jobs have their own pages
    return runs[0].id if runs else None


def _toast_new_alerts(run_id: str, alerts: tuple) -> None:
    """Each alert pops up once per browser session; the list on the page keeps them all."""
    seen = st.session_state.setdefault("live_alerts_seen", {})
    for alert in alerts[seen.get(run_id, 0):]:
        st.toast(safe(alert.message), icon="⚠️")
    seen[run_id] = len(alerts)


run_id = _chosen_run_id()
st.title("Live")
snapshot = orch.snapshot(run_id) if run_id else None
if snapshot is None:
    render_live(None)
    st.stop()

active_id = orch.active_run_id()
if active_id and active_id != run_id:
    if st.button("Another run is training: show it", icon="🏃"):
        st.session_state["live_run_id"] = active_id
        st.rerun()

# Buttons and chart controls live outside the auto-refreshing fragment: a click reruns the page once.
shown_active = not RunStatus(snapshot.status).is_terminal()
if shown_active:
    stop_col, cancel_col, _ = st.columns([1, 1, 4])
    stopping = snapshot.status is RunStatus.STOPPING
    row = orch.get_run(run_id)
    actor, owner = current_actor(), row.owner if row else ""
    may_stop = allowed(actor, Action.STOP, owner)
    not_yours = "" if may_stop else f" (only {owner or 'an admin'} or an admin can: you are {actor.role.value})"
    try:
        if stop_col.button("Stop & save", icon="💾", disabled=stopping or not may_stop,
                           help="End at the next step and save a checkpoint and the adapter." + not_yours):
            orch.stop(run_id, actor=actor)
            st.toast("Stopping: the run saves at the next step.")
        if cancel_col.button("Cancel", icon="✖️", disabled=not may_stop,
                             help="End at the next step without saving anything." + not_yours):
            orch.cancel(run_id, actor=actor)
            st.toast("Cancelling the run.")
    except RunRefused as exc:  # the role changed since the page was drawn
        st.error(str(exc), icon="🚫")
else:
    st.page_link("pages/run.py", label="Open run details", icon="🔎", query_params={"run": run_id})
specs = run_specs(orch.run_config(run_id))  # the method's charts and tiles
with st.expander("Chart options", icon="⚙️"):
    options = chart_controls("live")
st.session_state.setdefault("live_alerts_seen", {}).setdefault(run_id, len(snapshot.alerts))  # old ones: no toast


sampling = sampling_configured(orch.run_config(run_id))
LIVE_SAMPLE_STEPS = 10  # the newest sampling steps shown here; Run details shows more


def samples_panel() -> None:
    if sampling:
        st.subheader("Samples during training")
        # spoken samples: the newest step's clips only, on a page that redraws every second
        render_samples(orch.samples(run_id, max_steps=LIVE_SAMPLE_STEPS), expected=True, audio_steps=1)


@st.fragment(run_every=REFRESH_S if shown_active else None)
def live_panel() -> None:
    latest = orch.snapshot(run_id)
    if latest is not None:
        _toast_new_alerts(run_id, latest.alerts)
    # The "Other metrics" picker is drawn in the fragment: keys the run logs later are offered at the next refresh
    render_live(latest, options, alerts=latest.alerts if latest else (),
                resources=orch.resources(run_id) if shown_active else None, specs=specs, picker="live")
    render_ray(paths.run_dir(run_id))  # a run on the Ray cluster: its job, and each rank's node once placed
    samples_panel()
    if shown_active and latest is not None and RunStatus(latest.status).is_terminal():
        st.rerun()  # the run just ended: redraw the whole page so Stop/Cancel go away


live_panel()
