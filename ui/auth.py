"""An optional password gate for the shared URL.

The password comes from ``st.secrets["studio_password"]`` (``.streamlit/secrets.toml``) or the
``FINETUNE_STUDIO_PASSWORD`` environment variable; with neither, the gate is off. It is checked in the
entry point before any page runs, and compared in constant time (on digests, so the length of the
password does not leak either). A session that passed the gate stays signed in until the tab closes.
"""
from __future__ import annotations

import hashlib
import hmac
import os

import streamlit as st

_SIGNED_IN = "_studio_signed_in"
ENV_VAR = "FINETUNE_STUDIO_PASSWORD"
SECRET_KEY = "studio_password"


def configured_password() -> str:
    try:
        from_secrets = st.secrets.get(SECRET_KEY, "")
    except (FileNotFoundError, KeyError):  # no secrets.toml at all
        from_secrets = ""
    return str(from_secrets or os.environ.get(ENV_VAR, ""))


def password_matches(given: str, expected: str) -> bool:
    """Constant-time comparison of two passwords (digests first: equal lengths, no early exit)."""
    digest = lambda text: hashlib.sha256(text.encode("utf-8")).digest()  # noqa: E731
    return hmac.compare_digest(digest(given), digest(expected))


def signed_in() -> bool:
    """True when the gate is off or this session has passed it."""
    return bool(st.session_state.get(_SIGNED_IN)) or not configured_password()


def require_password() -> None:
    """Stop the script with a sign-in form unless the gate is off or this session signed in."""
    if signed_in():
        return
    expected = configured_password()
    st.title("Finetune Studio")
    with st.form("sign_in"):
        given = st.text_input("Password", type="password", key="_studio_password_input",
                              help=f"Set by the host in .streamlit/secrets.toml ({SECRET_KEY}) or {ENV_VAR}.")
        submitted = st.form_submit_button("Sign in", type="primary")
    if submitted:
        if password_matches(given, expected):
            st.session_state[_SIGNED_IN] = True
            st.session_state.pop("_studio_password_input", None)
            st.rerun()
        st.error("Wrong password.")
    st.stop()
