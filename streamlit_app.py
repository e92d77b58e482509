"""Finetune Studio entry point: page setup, navigation and the shared sidebar."""
from __future__ import annotations

import streamlit as st

from trainer_core.status import RunStatus
from ui import format as fmt
from ui.auth import current_actor, require_password, shared_mode
from ui.entry import entered, remember_requested_page, resume_requested_page
from ui.state import get_orchestrator
from ui.text import safe

SIDEBAR_REFRESH_S = 2.0

st.set_page_config(page_title="Finetune Studio", page_icon="🧪", layout="wide")
# The gate comes first: no page, sidebar or run data is drawn for a stranger. A page URL opened before
# signing in goes through here too (ui.entry.require_entrypoint checks the gate as well).
remember_requested_page()
require_password()

pg = st.navigation([
    st.Page("pages/new_run.py", title="New run", icon="🚀", default=True),
    st.Page("pages/live.py", title="Live", icon="📈"),
    st.Page("pages/history.py", title="History", icon="🗂️"),
    st.Page("pages/run.py", title="Run details", icon="🔎"),
    st.Page("pages/compare.py", title="Compare", icon="⚖️"),
    st.Page("pages/account.py", title="Account", icon="👤"),
])
entered()
resume_requested_page()

orch = get_orchestrator()
watching = orch.active_run_id() is not None


@st.fragment(run_every=SIDEBAR_REFRESH_S if watching else None)
def active_run_panel() -> None:
    run_id = orch.active_run_id()
    run = orch.get_run(run_id) if run_id else None
    if run is None:
        st.caption("No run is training.")
        return
    st.markdown(f"**{safe(run.name or run.id, limit=80)}**  \n{fmt.status_badge(RunStatus(run.status))}"
                + (f" · {safe(run.phase, limit=80)}" if run.phase else ""))
    if run.total_steps:
        st.progress(min(1.0, run.steps_done / run.total_steps), text=f"step {run.steps_done} / {run.total_steps}")
    st.page_link("pages/live.py", label="Open live view", icon="📈")


with st.sidebar:
    st.markdown("#### Active run")
    active_run_panel()
    if shared_mode():
        me = current_actor()
        st.caption(f"Signed in as **{safe(me.name, limit=60)}** ({me.role.value}) · [Sign out](/auth/logout)")

pg.run()
