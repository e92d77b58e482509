"""The sign-in service: its own process on loopback, asked by nginx (``auth_request``) about every request.

* ``GET /auth/check`` (internal to nginx): 204 with ``X-Studio-User`` and ``X-Studio-Session`` for a valid
  session cookie whose user still exists with the same session generation, else 401.
* ``GET /auth/start`` (internal): where nginx sends a request that failed the check; a page load is
  redirected to the sign-in page with the URL it asked for (deep links survive), anything else gets 401.
* ``GET|POST /auth/login``: the password form (password mode) or the redirect to the OIDC provider.
* ``GET /auth/callback`` (OIDC mode only): the provider's answer (Authlib checks state, nonce and the ID token).
* ``GET /auth/logout`` asks to confirm; ``POST /auth/logout`` with the form's token signs the user out
  everywhere (their session generation goes up, so every cookie issued before stops working).

Sessions are cookies signed with itsdangerous (a key made at start, or ``FINETUNE_STUDIO_SESSION_KEY`` to
survive restarts), valid ``FINETUNE_STUDIO_SESSION_HOURS``, and checked against the users table on every
request: removing a user, giving them a lower role or their sign-out ends their sessions at once. The
shared password is kept only as an argon2 hash in memory. Wrong passwords are limited per client address
(MAX_FAILURES a minute, counted here: successful sign-ins never count); nginx only caps the request rate.
"""
from __future__ import annotations

import argparse
import html
import math
import os
import re
import secrets
import sys
import threading
import time
from collections import deque
from urllib.parse import quote, urlencode

import uvicorn
from argon2 import PasswordHasher
from argon2.exceptions import VerificationError
from authlib.integrations.starlette_client import OAuth, OAuthError
from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from db import users
from db.store import Store
from gateway import settings
from gateway.settings import AuthSettings

COOKIE = "studio_session"
USER_HEADER = "X-Studio-User"
SESSION_HEADER = "X-Studio-Session"  # the session generation, checked again by the dashboard
SESSION_KEY_ENV = "FINETUNE_STUDIO_SESSION_KEY"
_NAME_RE = re.compile(r"^[\w.@+-][\w .@+-]{0,63}$")


def safe_next(target: str | None) -> str:
    """Only a path on this site (no scheme, no //host, no backslash tricks, never the sign-in pages)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")) or "\\" in target \
            or target.startswith("/auth/") or any(ord(c) < 32 for c in target):
        return "/"
    return target


def oidc_user_name(claims: dict) -> str:
    """The e-mail, unless the provider marks it unverified (it could be anyone's, an admin's say): then the
    subject id, which the provider guarantees unique."""
    email = claims.get("email") if claims.get("email_verified", True) is not False else None
    return str(email or claims.get("sub") or "")


class FailedSignIns:
    """Wrong passwords per client address: after MAX_FAILURES within WINDOW_S seconds every attempt from
    that address is refused (the right password too, checked before it) until the oldest ages out."""

    MAX_FAILURES = 5
    WINDOW_S = 60.0
    MAX_ADDRESSES = 10_000  # a flood of addresses cannot grow this without bound

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: dict[str, deque[float]] = {}

    def wait_s(self, address: str, now: float) -> float:
        with self._lock:
            failures = self._failures.get(address)
            while failures and now - failures[0] > self.WINDOW_S:
                failures.popleft()
            if not failures:
                self._failures.pop(address, None)
                return 0.0
            return self.WINDOW_S - (now - failures[0]) if len(failures) >= self.MAX_FAILURES else 0.0

    def failed(self, address: str, now: float) -> None:
        with self._lock:
            if address not in self._failures and len(self._failures) >= self.MAX_ADDRESSES:
                self._failures.pop(next(iter(self._failures)))  # the address seen longest ago
            self._failures.setdefault(address, deque(maxlen=self.MAX_FAILURES)).append(now)


def create_app(cfg: AuthSettings, store: Store, session_key: str, secure: bool) -> Starlette:
    sessions = URLSafeTimedSerializer(session_key, salt="finetune-studio-session")
    logout_tokens = URLSafeTimedSerializer(session_key, salt="finetune-studio-logout")
    max_age = int(cfg.session_hours * 3600)
    hasher = PasswordHasher()
    password_hash = hasher.hash(cfg.password) if cfg.mode == "password" else ""
    failures = FailedSignIns()
    oauth = OAuth()
    if cfg.mode == "oidc":
        oauth.register("provider", client_id=cfg.client_id, client_secret=cfg.client_secret,
                       server_metadata_url=f"{cfg.issuer}/.well-known/openid-configuration",
                       client_kwargs={"scope": "openid email profile"})

    def signed_in_response(name: str, target: str) -> Response:
        user = users.ensure_user(store, name, cfg.role_for_new_user(name))
        response = RedirectResponse(safe_next(target), status_code=303)
        response.set_cookie(COOKIE, sessions.dumps({"u": name, "g": user.session_generation}), max_age=max_age,
                            httponly=True, secure=secure, samesite="lax", path="/")
        return response

    def session_of(request: Request) -> tuple[str, int] | None:
        """(user, generation) of a cookie that is signed, fresh, well-formed and not ended; else None."""
        try:
            data = sessions.loads(request.cookies.get(COOKIE, ""), max_age=max_age)
        except BadSignature:  # also SignatureExpired
            return None
        name, generation = (data.get("u"), data.get("g")) if isinstance(data, dict) else (None, None)
        if not isinstance(name, str) or not name or type(generation) is not int:
            return None
        return (name, generation) if users.session_user(store, name, generation) is not None else None

    def check(request: Request) -> Response:  # sync: Starlette runs it in a thread, the database read blocks
        session = session_of(request)
        if session is None:
            return Response(status_code=401)
        name, generation = session
        return Response(status_code=204, headers={USER_HEADER: quote(name, safe="@"), SESSION_HEADER: str(generation)})

    async def start(request: Request) -> Response:
        original = request.headers.get("X-Original-URI", "/")
        page_load = request.headers.get("X-Original-Method", "GET") in ("GET", "HEAD") and \
            not original.startswith(("/_stcore/", "/media/", "/static/", "/component/")) and \
            "text/html" in request.headers.get("Accept", "")
        if not page_load:
            return Response("sign in first\n", status_code=401, media_type="text/plain")
        return RedirectResponse("/auth/login?" + urlencode({"next": safe_next(original)}), status_code=302)

    def form(target: str, message: str = "", status: int = 200, headers: dict[str, str] | None = None) -> HTMLResponse:
        note = f'<p role="alert" style="color:#b00">{html.escape(message)}</p>' if message else ""
        return HTMLResponse(
            f"""<!doctype html><html><head><meta charset="utf-8"><title>Sign in · Finetune Studio</title>
<meta name="viewport" content="width=device-width"></head>
<body style="font-family:sans-serif;max-width:22rem;margin:4rem auto">
<h1>Finetune Studio</h1>{note}
<form method="post" action="/auth/login">
<input type="hidden" name="next" value="{html.escape(safe_next(target))}">
<p><label>Your name<br><input name="name" autocomplete="username" required maxlength="64"></label></p>
<p><label>Password<br><input name="password" type="password" autocomplete="current-password" required></label></p>
<p><button type="submit">Sign in</button></p></form></body></html>""",
            status_code=status, headers={"Cache-Control": "no-store", **(headers or {})})

    async def login(request: Request) -> Response:
        target = safe_next(request.query_params.get("next"))
        if cfg.mode == "oidc":
            request.session["next"] = target
            # Never from the request's Host header: a forged one would send the provider's code elsewhere.
            return await oauth.provider.authorize_redirect(request, f"{cfg.public_url}/auth/callback")
        if request.method == "GET":
            return form(target)
        data = await request.form()
        target = safe_next(str(data.get("next", "/")))
        name, given = str(data.get("name", "")).strip(), str(data.get("password", ""))
        address, now = _client_address(request), time.monotonic()
        wait = failures.wait_s(address, now)
        if wait > 0:  # before the password is checked: guesses during the pause learn nothing
            seconds = math.ceil(wait)
            return form(target, f"Too many wrong passwords from your address: try again in {seconds} s.", 429,
                        {"Retry-After": str(seconds)})
        if not _NAME_RE.match(name):
            return form(target, "Your name: 1 to 64 letters, digits, spaces or . @ + - _", 400)
        try:
            hasher.verify(password_hash, given)
        except VerificationError:
            failures.failed(address, now)
            return form(target, "Wrong password.", 401)
        return signed_in_response(name, target)

    async def callback(request: Request) -> Response:
        try:
            token = await oauth.provider.authorize_access_token(request)
        except OAuthError as exc:
            return HTMLResponse(f"<p>Sign-in failed: {html.escape(exc.description or exc.error)}. "
                                '<a href="/auth/login">Try again</a>.</p>', status_code=401)
        name = oidc_user_name(token.get("userinfo") or {})
        if not name:
            return HTMLResponse("<p>The provider sent no user name.</p>", status_code=401)
        return signed_in_response(name, request.session.pop("next", "/"))

    async def logout(request: Request) -> Response:
        session = session_of(request)
        if request.method == "GET":  # never signs out by itself: a link or an image elsewhere cannot do it
            if session is None:
                return RedirectResponse("/auth/login", status_code=303)
            return HTMLResponse(
                f"""<!doctype html><html><head><meta charset="utf-8"><title>Sign out · Finetune Studio</title>
<meta name="viewport" content="width=device-width"></head>
<body style="font-family:sans-serif;max-width:22rem;margin:4rem auto">
<h1>Finetune Studio</h1><p>Sign out {html.escape(session[0])}? This ends your sessions in every browser.</p>
<form method="post" action="/auth/logout">
<input type="hidden" name="token" value="{logout_tokens.dumps({"u": session[0], "g": session[1]})}">
<p><button type="submit">Sign out</button> <a href="/">Back</a></p></form></body></html>""",
                headers={"Cache-Control": "no-store"})
        data = await request.form()
        try:
            asked = logout_tokens.loads(str(data.get("token", "")), max_age=max_age)
        except BadSignature:
            asked = None
        if session is not None and asked != {"u": session[0], "g": session[1]}:
            return HTMLResponse('<p>This sign-out form is stale or not from this site: <a href="/auth/logout">'
                                "sign out again</a>.</p>", status_code=403)
        if session is not None:
            users.end_sessions(store, session[0])
        response = RedirectResponse("/auth/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    routes = [Route("/auth/check", check), Route("/auth/start", start), Route("/auth/login", login, methods=["GET", "POST"]),
              Route("/auth/logout", logout, methods=["GET", "POST"])]
    if cfg.mode == "oidc":  # password mode has no provider to come back from: 404
        routes.append(Route("/auth/callback", callback))
    middleware = [Middleware(SessionMiddleware, secret_key=session_key, session_cookie="studio_oidc",
                             https_only=secure, same_site="lax", max_age=600)]
    return Starlette(routes=routes, middleware=middleware)


def _client_address(request: Request) -> str:
    """nginx replaces X-Forwarded-For with the address it saw ($remote_addr); only nginx reaches us."""
    return request.headers.get("X-Forwarded-For") or (request.client.host if request.client else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Finetune Studio sign-in service (run by `make share`)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--secure", action="store_true", help="cookies only over HTTPS (nginx serves TLS)")
    args = parser.parse_args(argv)
    try:
        cfg = settings.load()
    except settings.SettingsError as exc:
        print(exc, file=sys.stderr)
        return 2
    session_key = os.environ.pop(SESSION_KEY_ENV, "") or secrets.token_urlsafe(32)
    app = create_app(cfg, Store(), session_key, args.secure)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False,
                proxy_headers=False, server_header=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
