"""Make every page render through ``streamlit_app.py``.

Streamlit still honours the legacy ``pages/`` folder until the entry point's ``st.navigation`` has
run once in the server process: the first request after a server start that lands on a page URL
(a bookmark, a reload) would run that page script on its own, skipping the entry point's layout,
shared sidebar and anything else it sets up. Pages call :func:`require_entrypoint`; the entry point
calls :func:`entered` and then :func:`resume_requested_page`.
"""
from __future__ import annotations

import streamlit as st

from ui.auth import signed_in

_ENTERED = "_studio_entered"
_RETURN_TO = "_studio_return_to"
ENTRYPOINT = "streamlit_app.py"


def entered() -> None:
    st.session_state[_ENTERED] = True


def require_entrypoint(page: str) -> None:
    """Called first by each page: if the entry point did not run (or its password gate was not
    passed), go through it and come back."""
    if not st.session_state.get(_ENTERED) or not signed_in():
        st.session_state[_RETURN_TO] = page
        st.switch_page(ENTRYPOINT)


def resume_requested_page() -> None:
    """Called by the entry point after ``st.navigation``: return to the page that was asked for."""
    page = st.session_state.pop(_RETURN_TO, None)
    if page:
        st.switch_page(page)
