"""The one Orchestrator of this server process, shared by every browser session."""
from __future__ import annotations

import streamlit as st
from sqlalchemy.exc import SQLAlchemyError

from trainer_core.jobs import rebuild
from trainer_core.jobs.orchestrator import Orchestrator


@st.cache_resource(show_spinner=False)
def get_orchestrator() -> Orchestrator:
    # One per server process; a hot reload may build a second one, which is why the orchestrator
    # guards runs with a lock file rather than trusting this singleton alone.
    return Orchestrator()


def orchestrator_or_problem() -> tuple[Orchestrator | None, str | None]:
    """The orchestrator, or why the database keeps it from being built (a message with the way out)."""
    try:
        return get_orchestrator(), None
    except SQLAlchemyError as exc:  # a corrupt or unreadable database: a message, never a traceback
        return None, rebuild.describe_error(exc)


def rebuild_database() -> rebuild.RebuildReport:
    """Close this server's orchestrator (workers keep training), rebuild the database from the run folders,
    and let the next page run build a fresh orchestrator that adopts the runs still going.

    Raises rebuild.RebuildRefused when another dashboard or CLI is following a run."""
    orch, _ = orchestrator_or_problem()
    if orch is not None:
        orch.close()  # releases its pump locks, which the rebuild takes
        orch.store.engine.dispose()  # no connection may hold the SQLite file while it moves aside
    get_orchestrator.clear()
    return rebuild.rebuild()
