"""Make every page render through ``streamlit_app.py``.

Streamlit still honours the legacy ``pages/`` folder until the entry point's ``st.navigation`` has
run once in the server process: the first request after a server start that lands on a page URL
(a bookmark, a reload) would run that page script on its own, skipping the entry point's layout,
shared sidebar and anything else it sets up. Pages call :func:`require_entrypoint`; the entry point
calls :func:`entered` and then :func:`resume_requested_page`.
"""
from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import streamlit as st

from ui.auth import signed_in

_ENTERED = "_studio_entered"
_RETURN_TO = "_studio_return_to"
ENTRYPOINT = "streamlit_app.py"


def entered() -> None:
    st.session_state[_ENTERED] = True


def _query() -> dict[str, list[str]]:
    return {key: st.query_params.get_all(key) for key in st.query_params}


def require_entrypoint(page: str) -> None:
    """Called first by each page: if the entry point did not run (or its password gate was not
    passed), go through it and come back, query included (?run=ID survives signing in)."""
    if not st.session_state.get(_ENTERED) or not signed_in():
        st.session_state.setdefault(_RETURN_TO, (page, _query()))
        st.switch_page(ENTRYPOINT)


def remember_requested_page() -> None:
    """Called by the entry point before its gate: a deep link (``/run?run=ID``) opened by someone not yet
    signed in is remembered, so signing in lands on it rather than on the default page."""
    if signed_in() or _RETURN_TO in st.session_state:
        return
    slug = urlsplit(st.context.url or "").path.rstrip("/").rsplit("/", 1)[-1]
    page = f"pages/{slug}.py" if slug else ""
    if page and (Path(__file__).resolve().parents[1] / page).is_file():
        st.session_state[_RETURN_TO] = (page, _query())


def resume_requested_page() -> None:
    """Called by the entry point after ``st.navigation``: return to the page that was asked for."""
    requested = st.session_state.pop(_RETURN_TO, None)
    if requested:
        page, query = requested
        st.switch_page(page, query_params=query or None)
