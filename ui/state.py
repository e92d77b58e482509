"""The one Orchestrator of this server process, shared by every browser session."""
from __future__ import annotations

import streamlit as st

from trainer_core.orchestrator import Orchestrator


@st.cache_resource(show_spinner=False)
def get_orchestrator() -> Orchestrator:
    # One per server process; a hot reload may build a second one, which is why the orchestrator
    # guards runs with a lock file rather than trusting this singleton alone.
    return Orchestrator()
