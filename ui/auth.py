"""Who is using this session, and the in-app password gate of ``make run``.

Shared mode (``make share``, ``FINETUNE_STUDIO_SHARED=1``): nginx authenticates every request through
the sign-in service and sets ``X-Studio-User`` itself (a value sent by the browser is overwritten), and
Streamlit listens on loopback only, so the header is the identity; its role comes from the users table.
Without the header the app refuses to draw anything (fail closed). ``X-Studio-Session`` carries the
session generation the cookie was signed with: every script run checks it against the users table, so a
session that was signed out, or whose user was removed or given a lower role, ends at once, even over a
WebSocket opened before.

Local mode (``make run``): the OS user, as admin. An optional password from ``.streamlit/secrets.toml``
(``studio_password``) or ``FINETUNE_STUDIO_PASSWORD`` is asked first, compared in constant time (on
digests, so the length does not leak either) and limited to 5 wrong tries a minute for the whole server;
a secrets file that does not parse stops every page with the file and line instead of turning the
password off.
"""
from __future__ import annotations

import hashlib
import hmac
import math
import os
import threading
import time
from collections import deque
from urllib.parse import unquote

import streamlit as st

from db import users
from gateway import settings
from gateway.settings import SettingsError
from db.models import User
from trainer_core.auth.access import Actor, Role
from ui.state import get_orchestrator

_SIGNED_IN = "_studio_signed_in"
ENV_VAR = settings.PASSWORD_ENV
SECRET_KEY = settings.PASSWORD_KEY
SHARED_ENV = "FINETUNE_STUDIO_SHARED"
USER_HEADER = "X-Studio-User"  # set by nginx from the sign-in service's answer; percent-encoded UTF-8
SESSION_HEADER = "X-Studio-Session"  # set by nginx the same way: the session generation (an integer)
SESSION_ENDED = ("Your session has ended: you signed out, or an admin removed your account or changed your role. "
                 "Reload the page to sign in again.")


def shared_mode() -> bool:
    return os.environ.get(SHARED_ENV) == "1"


def configured_password() -> str:
    """The in-app password ("" = no gate). Raises SettingsError for a secrets file that cannot be read."""
    return settings.configured_password()


def password_matches(given: str, expected: str) -> bool:
    """Constant-time comparison of two passwords (digests first: equal lengths, no early exit)."""
    digest = lambda text: hashlib.sha256(text.encode("utf-8")).digest()  # noqa: E731
    return hmac.compare_digest(digest(given), digest(expected))


class _Attempts:
    """Wrong passwords of the whole server (every session): after MAX_FAILURES within WINDOW_S seconds,
    every attempt is refused until the oldest of them ages out. Opening new sessions does not reset it."""

    MAX_FAILURES = 5
    WINDOW_S = 60.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: deque[float] = deque()

    def wait_s(self, now: float) -> float:
        with self._lock:
            while self._failures and now - self._failures[0] > self.WINDOW_S:
                self._failures.popleft()
            if len(self._failures) < self.MAX_FAILURES:
                return 0.0
            return self.WINDOW_S - (now - self._failures[0])

    def failed(self, now: float) -> None:
        with self._lock:
            self._failures.append(now)


@st.cache_resource(show_spinner=False)
def _attempts() -> _Attempts:
    return _Attempts()


def proxy_user() -> str:
    return unquote(st.context.headers.get(USER_HEADER, "") or "")


def proxy_session() -> int | None:
    """The session generation nginx passed on; None without a well-formed one."""
    value = st.context.headers.get(SESSION_HEADER, "") or ""
    return int(value) if value.isdigit() else None


def _shared_user() -> User | None:
    """The users-table row of this session, or None when the session has ended (or never was)."""
    name, generation = proxy_user(), proxy_session()
    if not name or generation is None:
        return None
    return users.session_user(get_orchestrator().store, name, generation)


def current_actor() -> Actor:
    """The person acting in this session (call after the gate). Shared mode: read from the users table at
    each call; a session that has ended stops the script (a fragment's rerun included) with the reason."""
    if shared_mode():
        user = _shared_user()
        if user is None:
            st.error(SESSION_ENDED)
            st.stop()
        return Actor(user.name, Role(user.role))
    return Actor.local()


def signed_in() -> bool:
    """True when this session may see the app (a misconfigured gate counts as closed)."""
    if shared_mode():
        return _shared_user() is not None
    try:
        return bool(st.session_state.get(_SIGNED_IN)) or not configured_password()
    except SettingsError:
        return False


def require_password() -> None:
    """Stop the script unless this session may see the app: a sign-in form, or an error that says why."""
    if shared_mode():
        if not proxy_user():
            st.error("This server runs in shared mode and only answers through its sign-in proxy "
                     "(`make share`); this request did not come through it.")
            st.stop()
        if _shared_user() is None:
            st.error(SESSION_ENDED)
            st.stop()
        return
    try:
        expected = configured_password()
    except SettingsError as exc:
        st.error(str(exc))
        st.stop()
    if not expected or st.session_state.get(_SIGNED_IN):
        return
    st.title("Finetune Studio")
    with st.form("sign_in"):
        given = st.text_input("Password", type="password", key="_studio_password_input",
                              help=f"Set by the host in .streamlit/secrets.toml ({SECRET_KEY}) or {ENV_VAR}.")
        submitted = st.form_submit_button("Sign in", type="primary")
    if submitted:
        attempts, now = _attempts(), time.monotonic()
        wait = attempts.wait_s(now)
        if wait > 0:  # checked before the password, so guesses during the pause learn nothing
            st.error(f"Too many wrong passwords: try again in {math.ceil(wait)} s.")
            st.stop()
        if password_matches(given, expected):
            st.session_state[_SIGNED_IN] = True
            st.session_state.pop("_studio_password_input", None)
            st.rerun()
        attempts.failed(now)
        st.error("Wrong password.")
    st.stop()
