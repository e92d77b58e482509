"""Settings and maintenance: where the data lives, rebuilding the database from the run folders, and the Ray
cluster runs may go to (checked from here; an admin saves one here)."""
from __future__ import annotations

import streamlit as st

from db.store import default_url
from trainer_core.auth.access import Action, Actor, Role, allowed
from trainer_core.jobs import rebuild
from trainer_core.protocol import paths
from ui import ray_settings
from ui.auth import current_actor, shared_mode
from ui.text import code, safe
from ui.entry import require_entrypoint
from ui.server_paths import for_actor
from ui.state import orchestrator_or_problem, rebuild_database

require_entrypoint("pages/settings.py")

st.title("Settings")
orch, problem = orchestrator_or_problem()
# Without a readable database a shared server cannot tell who this is: it shows what a viewer would see
viewer = current_actor() if problem is None else Actor.local() if not shared_mode() else Actor("", Role.VIEWER)
st.subheader("Data")
database = rebuild.database_label(default_url())
if viewer.role is Role.ADMIN:  # server paths are an admin's to see; anyone else reads them by name (issue 31 #9)
    st.markdown(f"Data folder: {code(paths.data_root())}  \nDatabase: {code(database)}")
else:
    st.markdown(f"Data folder: the data root  \nDatabase: {safe(for_actor(database, viewer))}")

st.subheader("Database")
st.markdown(
    "The database is a cache. Every run folder keeps its config (`config.yaml`), what the worker reported "
    "(`events.jsonl`) and what the dashboard decided (`journal.jsonl`), so runs, statuses, metrics, timelines "
    "and alerts can all be rebuilt from them. Rebuilding moves the current database file aside (it is kept, "
    "never deleted) and builds a new one; runs still training are followed again afterwards.")

if problem is None:
    unknown = rebuild.unknown_run_folders(orch.store)
    if unknown:
        st.warning(f"{len(unknown)} run folder(s) are missing from the database: rebuild it to bring them back.",
                   icon="🗄️")
    else:
        st.success("The database knows every run folder.", icon="✅")

result = st.session_state.pop("settings_rebuild_result", None)
if result is not None:
    kind, message = result
    (st.success if kind == "ok" else st.error)(message)

if problem is None:
    may_rebuild = allowed(viewer, Action.MAINTAIN)
    reason = "Only an admin can rebuild the database."
else:  # the users table is in the broken database: in shared mode only the host's shell can decide
    may_rebuild = not shared_mode()
    reason = "Run `python -m trainer_core db rebuild` on the host (the users table is in the broken database)."
if not may_rebuild:
    st.info(reason, icon="🔒")
if st.button("Rebuild the database from the run folders", icon="🛠️", type="primary" if problem else "secondary",
             disabled=not may_rebuild):
    with st.spinner("Rebuilding from the run folders..."):
        try:
            report = rebuild_database()
            st.session_state["settings_rebuild_result"] = ("ok", report.summary())
        except rebuild.RebuildRefused as exc:
            st.session_state["settings_rebuild_result"] = ("error", str(exc))
    st.rerun()  # the entry point builds a fresh orchestrator on the rebuilt database

# A check submits a probe job to the cluster: whoever may start runs (operators, admins) may run it. Saving the
# cluster is an admin's (checked again when saving); without a readable database nothing saved can be shown.
actor = viewer if problem is None else Actor.local()  # no database: nothing saved to change either
ray_settings.settings_section(orch.store if problem is None else None, actor,
                              allowed(actor, Action.START) if problem is None else not shared_mode())
