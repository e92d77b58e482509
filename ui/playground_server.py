"""The Playground's model-server panel, shared by its modes (chat, speech to text): the serve job's state, which
refreshes itself while the job is queued or loading and redraws the whole page when that changes."""
from __future__ import annotations

from typing import Any

import streamlit as st

from ui import playground as pg
from ui.text import safe

STATE_REFRESH_S = 1.0


def server_panel(orch: Any, job_id: str, phase: str) -> None:
    """``phase``: the state the page was drawn with. Refreshes only while the job is queued or loading: a fragment
    rerun must never cut into a page's answer loop."""
    @st.fragment(run_every=STATE_REFRESH_S if phase in (pg.QUEUED, pg.LOADING) else None)
    def panel() -> None:
        now = pg.server_state(orch, job_id)
        if now.phase != phase:
            st.rerun()
        if now.ready:
            st.caption(safe(f"{now.message} · job {job_id}"))
            return
        show = st.error if now.phase in (pg.FAILED, pg.ENDED) else st.info
        show(safe(now.message), icon="⏳" if now.phase in (pg.QUEUED, pg.LOADING) else "🛑")
        if now.log_tail:
            st.code(now.log_tail, language=None)

    panel()
