"""The sign-in service: its own process on loopback, asked by nginx (``auth_request``) about every request.

* ``GET /auth/check`` (internal to nginx): 204 with ``X-Studio-User`` for a valid session cookie, else 401.
* ``GET /auth/start`` (internal): where nginx sends a request that failed the check; a page load is
  redirected to the sign-in page with the URL it asked for (deep links survive), anything else gets 401.
* ``GET|POST /auth/login``: the password form (password mode) or the redirect to the OIDC provider.
* ``GET /auth/callback``: the OIDC provider's answer (Authlib checks state, nonce and the ID token).
* ``GET /auth/logout``.

Sessions are cookies signed with itsdangerous (a key made at start, or ``FINETUNE_STUDIO_SESSION_KEY`` to
survive restarts), valid ``FINETUNE_STUDIO_SESSION_HOURS``. The shared password is kept only as an
argon2 hash in memory. Rate limiting of ``POST /auth/login`` is nginx's job (``limit_req``).
"""
from __future__ import annotations

import argparse
import html
import os
import re
import secrets
import sys
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


def create_app(cfg: AuthSettings, store: Store, session_key: str, secure: bool) -> Starlette:
    sessions = URLSafeTimedSerializer(session_key, salt="finetune-studio-session")
    max_age = int(cfg.session_hours * 3600)
    hasher = PasswordHasher()
    password_hash = hasher.hash(cfg.password) if cfg.mode == "password" else ""
    oauth = OAuth()
    if cfg.mode == "oidc":
        oauth.register("provider", client_id=cfg.client_id, client_secret=cfg.client_secret,
                       server_metadata_url=f"{cfg.issuer}/.well-known/openid-configuration",
                       client_kwargs={"scope": "openid email profile"})

    def signed_in_response(name: str, target: str) -> Response:
        users.ensure_user(store, name, cfg.role_for_new_user(name))
        response = RedirectResponse(safe_next(target), status_code=303)
        response.set_cookie(COOKIE, sessions.dumps({"u": name}), max_age=max_age, httponly=True, secure=secure,
                            samesite="lax", path="/")
        return response

    async def check(request: Request) -> Response:
        try:
            data = sessions.loads(request.cookies.get(COOKIE, ""), max_age=max_age)
        except BadSignature:  # also SignatureExpired
            return Response(status_code=401)
        return Response(status_code=204, headers={USER_HEADER: quote(data["u"], safe="@")})

    async def start(request: Request) -> Response:
        original = request.headers.get("X-Original-URI", "/")
        page_load = request.headers.get("X-Original-Method", "GET") in ("GET", "HEAD") and \
            not original.startswith(("/_stcore/", "/media/", "/static/", "/component/")) and \
            "text/html" in request.headers.get("Accept", "")
        if not page_load:
            return Response("sign in first\n", status_code=401, media_type="text/plain")
        return RedirectResponse("/auth/login?" + urlencode({"next": safe_next(original)}), status_code=302)

    def form(target: str, message: str = "", status: int = 200) -> HTMLResponse:
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
            status_code=status, headers={"Cache-Control": "no-store"})

    async def login(request: Request) -> Response:
        target = safe_next(request.query_params.get("next"))
        if cfg.mode == "oidc":
            request.session["next"] = target
            callback = f"{cfg.public_url or _origin(request)}/auth/callback"
            return await oauth.provider.authorize_redirect(request, callback)
        if request.method == "GET":
            return form(target)
        data = await request.form()
        target = safe_next(str(data.get("next", "/")))
        name, given = str(data.get("name", "")).strip(), str(data.get("password", ""))
        if not _NAME_RE.match(name):
            return form(target, "Your name: 1 to 64 letters, digits, spaces or . @ + - _", 400)
        try:
            hasher.verify(password_hash, given)
        except VerificationError:
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
        response = RedirectResponse("/auth/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    routes = [Route("/auth/check", check), Route("/auth/start", start), Route("/auth/login", login, methods=["GET", "POST"]),
              Route("/auth/callback", callback), Route("/auth/logout", logout)]
    middleware = [Middleware(SessionMiddleware, secret_key=session_key, session_cookie="studio_oidc",
                             https_only=secure, same_site="lax", max_age=600)]
    return Starlette(routes=routes, middleware=middleware)


def _origin(request: Request) -> str:
    proto = request.headers.get("X-Forwarded-Proto", request.url.scheme)
    return f"{proto}://{request.headers.get('Host', request.url.netloc)}"


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
