"""The one Orchestrator of this server process, shared by every browser session, and the sweep runner beside it."""
from __future__ import annotations

import streamlit as st
from sqlalchemy.exc import SQLAlchemyError

from trainer_core.auth.access import Action, Actor, allowed
from trainer_core.jobs import rebuild
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.sweeps.runner import SweepRunner


_SWEEPS: dict[str, SweepRunner] = {}  # orchestrator holder -> the sweep runner beside it


@st.cache_resource(show_spinner=False)
def get_orchestrator() -> Orchestrator:
    # One per server process; a hot reload may build a second one, which is why the orchestrator
    # guards runs with a lock file rather than trusting this singleton alone.
    orch = Orchestrator()
    # Built with it, at server start: sweeps left running by an earlier server are driven again at once, and sweeps
    # lock themselves (docs/sweeps.md), so a second orchestrator's runner drives none twice.
    runner = _SWEEPS[orch.holder] = SweepRunner(orch)
    orch.add_closer(lambda: _SWEEPS.pop(orch.holder, runner).close())
    return orch


def get_sweeps() -> SweepRunner:
    """The sweep runner beside this server's orchestrator (start, stop, resume sweeps)."""
    orch = get_orchestrator()
    return _SWEEPS[orch.holder]


def orchestrator_or_problem() -> tuple[Orchestrator | None, str | None]:
    """The orchestrator, or why the database keeps it from being built (a message with the way out)."""
    try:
        return get_orchestrator(), None
    except SQLAlchemyError as exc:  # a corrupt or unreadable database: a message, never a traceback
        return None, rebuild.describe_error(exc)


def rebuild_database() -> rebuild.RebuildReport:
    """Close this server's orchestrator (workers keep training), rebuild the database from the run folders,
    and let the next page run build a fresh orchestrator that adopts the runs still going.

    Admins only: raises rebuild.RebuildRefused for anyone else (a disabled button alone let a crafted click
    through), and when another dashboard or CLI is following a run."""
    from ui import auth  # ui.auth imports this module (get_orchestrator): imported here, not at the top

    orch, problem = orchestrator_or_problem()
    if auth.shared_mode():
        if problem is not None:  # the users table is in the broken database: nobody's role can be checked
            raise rebuild.RebuildRefused("The database that holds users and roles cannot be read, so only the host "
                                         "can rebuild it: run `python -m trainer_core db rebuild` there.")
        actor = auth.current_actor()
    else:
        actor = Actor.local()  # a local dashboard: its user owns the data root, as the CLI's local user does
    if not allowed(actor, Action.MAINTAIN):
        raise rebuild.RebuildRefused(f"Only an admin can rebuild the database; {actor.name}'s role is {actor.role.value}.")
    if orch is not None:
        orch.close()  # releases its pump locks, which the rebuild takes
        orch.store.engine.dispose()  # no connection may hold the SQLite file while it moves aside
    get_orchestrator.clear()
    return rebuild.rebuild()
