"""Finetune Studio entry point: page setup, navigation and the shared sidebar."""
from __future__ import annotations

import streamlit as st
from sqlalchemy.exc import SQLAlchemyError

from trainer_core.jobs import rebuild
from trainer_core.protocol.status import RunStatus
from ui import format as fmt
from ui.auth import current_actor, require_password, shared_mode
from ui.entry import entered, remember_requested_page, resume_requested_page
from ui.state import orchestrator_or_problem
from ui.text import safe

SIDEBAR_REFRESH_S = 2.0
SETTINGS = "pages/settings.py"

st.set_page_config(page_title="Finetune Studio", page_icon="🧪", layout="wide")
# Built before the gate (it draws nothing): the first request after a server start, even a sign-in page,
# starts the pump and the queue, instead of the first one that gets past the password.
orch, db_problem = orchestrator_or_problem()
# The gate comes first among everything drawn: no page, sidebar or run data is shown to a stranger. A page
# URL opened before signing in is remembered, so signing in lands on it with its query (a deep link).
remember_requested_page()
require_password()

settings_page = st.Page(SETTINGS, title="Settings", icon="🛠️")
if db_problem:  # only the way out works without a database
    pg = st.navigation([settings_page])
else:
    pg = st.navigation([
        st.Page("pages/new_run.py", title="New run", icon="🚀", default=True),
        st.Page("pages/data.py", title="Data", icon="🧬"),
        st.Page("pages/live.py", title="Live", icon="📈"),
        st.Page("pages/history.py", title="History", icon="🗂️"),
        st.Page("pages/run.py", title="Run details", icon="🔎"),
        st.Page("pages/compare.py", title="Compare", icon="⚖️"),
        st.Page("pages/sweeps.py", title="Sweeps", icon="🧭"),
        st.Page("pages/playground.py", title="Playground", icon="💬"),
        st.Page("pages/feedback.py", title="Feedback", icon="🗳️"),
        st.Page("pages/account.py", title="Account", icon="👤"),
        settings_page,
    ])
entered()
resume_requested_page()

if db_problem:
    st.error(db_problem, icon="🗄️")
    pg.run()
    st.stop()


def _database_check() -> str | None:
    """A problem with the database found on this page run, as a message; None when it looks right."""
    try:
        unknown = rebuild.unknown_run_folders(orch.store)
    except SQLAlchemyError as exc:
        return rebuild.describe_error(exc, orch.store.url)
    if not unknown:
        return None
    shown = ", ".join(unknown[:3]) + (", ..." if len(unknown) > 3 else "")
    return (f"{len(unknown)} run folder(s) are not in the database ({shown}): it was probably deleted or replaced. "
            "Rebuild it from the run folders on the Settings page (the current file is kept).")


problem = _database_check()
if problem:
    st.warning(problem, icon="🗄️")
    st.page_link(SETTINGS, label="Open Settings to rebuild the database", icon="🛠️")
watching = not problem and orch.active_run_id() is not None


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
    if not problem:
        st.markdown("#### Active run")
        active_run_panel()
    if shared_mode():
        me = current_actor()
        st.caption(f"Signed in as **{safe(me.name, limit=60)}** ({me.role.value}) · [Sign out](/auth/logout)")

try:
    pg.run()
except SQLAlchemyError as exc:  # the database broke while the server ran: say so, offer the way out
    st.error(rebuild.describe_error(exc, orch.store.url), icon="🗄️")
    st.page_link(SETTINGS, label="Open Settings to rebuild the database", icon="🛠️")
