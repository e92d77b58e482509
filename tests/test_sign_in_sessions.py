"""Signing in to the shared URL, under a hostile or careless user: sessions and tokens that can be ended,
sign-out by POST with a token, the OIDC redirect from the configured URL only, no 500s from the sign-in
service, only failed sign-ins counted, explicit role changes on the Account page, and a supervisor whose
children never outlive it."""
from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import psutil
import pytest
from itsdangerous import URLSafeTimedSerializer
from oidc_provider_mock import run_server_in_thread
from starlette.testclient import TestClient
from streamlit.testing.v1 import AppTest

from db import users
from db.store import Store
from gateway import nginx, settings, signin
from gateway.__main__ import _status
from gateway.settings import AuthSettings
from tests.support.browser import free_port
from tests.support import wait_until
from tests.support.apptest import APP, TIMEOUT
from trainer_core.auth.access import Actor, Role
from ui import auth
from ui.state import get_orchestrator
from ui.text import safe

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "team password 42"
KEY = "a session key for the tests"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def store(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'studio.db'}")
    yield store
    store.engine.dispose()


@pytest.fixture
def client(store):
    app = signin.create_app(AuthSettings(mode="password", password=PASSWORD), store, KEY, secure=False)
    with TestClient(app, base_url="http://studio.test") as client:
        yield client


def sign_in(client: TestClient, name: str, password: str = PASSWORD, address: str = "198.51.100.1"):
    return client.post("/auth/login", data={"name": name, "password": password, "next": "/"},
                       headers={"X-Forwarded-For": address}, follow_redirects=False)


def cookie_of(response) -> dict[str, str]:
    assert response.status_code == 303, response.text
    return {signin.COOKIE: response.cookies[signin.COOKIE]}


def check(client: TestClient, cookies: dict[str, str]) -> int:
    client.cookies.clear()
    return client.get("/auth/check", cookies=cookies).status_code


# ====================================================================== sign-in service: no 500s
@pytest.mark.parametrize("payload", [{}, {"x": 1}, {"u": 5, "g": 0}, {"u": "", "g": 0}, {"u": "ann"},
                                     {"u": "ann", "g": "0"}, {"u": "ann", "g": True}, ["ann"], "ann"])
def test_a_validly_signed_cookie_without_a_user_or_generation_is_401(client, store, payload):
    users.ensure_user(store, "ann", Role.OPERATOR)
    forged = URLSafeTimedSerializer(KEY, salt="finetune-studio-session").dumps(payload)
    assert check(client, {signin.COOKIE: forged}) == 401


def test_the_oidc_callback_does_not_exist_in_password_mode(client):
    assert client.get("/auth/callback?code=x&state=y").status_code == 404


# ====================================================================== sessions end
def test_check_names_the_user_and_the_session_generation(client, store):
    cookies = cookie_of(sign_in(client, "ann"))
    response = client.get("/auth/check", cookies=cookies)
    assert response.status_code == 204
    assert response.headers[signin.USER_HEADER] == "ann"
    assert response.headers[signin.SESSION_HEADER] == str(users.get_user(store, "ann").session_generation)


def test_sign_out_is_a_post_with_the_forms_token_and_ends_every_session_of_that_user(client, store):
    laptop, phone = cookie_of(sign_in(client, "ann")), cookie_of(sign_in(client, "ann"))
    other = cookie_of(sign_in(client, "bob"))
    client.cookies.clear()
    page = client.get("/auth/logout", cookies=laptop)  # a link, an <img>, a prefetch: nothing happens
    assert page.status_code == 200 and 'method="post" action="/auth/logout"' in page.text
    assert check(client, laptop) == 204
    token = re.search(r'name="token" value="([^"]+)"', page.text).group(1)
    for forged in ({}, {"token": "forged"}, {"token": URLSafeTimedSerializer(KEY, salt="finetune-studio-logout")
                                                          .dumps({"u": "bob", "g": 1})}):
        client.cookies.clear()
        assert client.post("/auth/logout", data=forged, cookies=laptop, follow_redirects=False).status_code == 403
        assert check(client, laptop) == 204
    client.cookies.clear()
    response = client.post("/auth/logout", data={"token": token}, cookies=laptop, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/auth/login"
    assert f'{signin.COOKIE}=""' in response.headers["set-cookie"]
    assert check(client, laptop) == 401 and check(client, phone) == 401  # the copied cookie too
    assert check(client, other) == 204
    assert check(client, cookie_of(sign_in(client, "ann"))) == 204  # signing in again works
    client.cookies.clear()
    assert client.get("/auth/logout", cookies=laptop, follow_redirects=False).headers["location"] == "/auth/login"


def test_removing_a_user_ends_their_sessions_and_tokens_at_once(client, store):
    users.ensure_user(store, "ann", Role.OPERATOR)
    cookies = cookie_of(sign_in(client, "ann"))
    token = users.create_token(store, "ann")
    assert users.delete_user(store, "ann") is True
    assert check(client, cookies) == 401
    with pytest.raises(users.UnknownToken, match="unknown or was revoked"):
        users.user_for_token(store, token)  # not a ghost viewer
    users.ensure_user(store, "ann", Role.VIEWER)  # added again: the old cookie stays dead
    assert check(client, cookies) == 401
    assert users.delete_user(store, "ann") is True and users.delete_user(store, "ann") is False


def test_a_token_whose_user_row_is_gone_is_refused(store):
    users.ensure_user(store, "ann", Role.OPERATOR)
    token = users.create_token(store, "ann")
    with sqlite3.connect(store.url.removeprefix("sqlite:///")) as conn:  # deleted by hand, tokens left behind
        conn.execute("PRAGMA foreign_keys=OFF")
        conn.execute("DELETE FROM user WHERE name='ann'")
    with pytest.raises(users.UnknownToken):
        users.user_for_token(store, token)


def test_a_lower_role_ends_sessions_and_tokens_and_a_higher_one_keeps_them(client, store):
    users.ensure_user(store, "ann", Role.OPERATOR)
    cookies = cookie_of(sign_in(client, "ann"))
    token = users.create_token(store, "ann")
    users.set_role(store, "ann", Role.ADMIN)
    assert check(client, cookies) == 204
    assert users.user_for_token(store, token) == Actor("ann", Role.ADMIN)
    users.set_role(store, "ann", Role.VIEWER)
    assert check(client, cookies) == 401
    assert users.tokens_of(store, "ann") == []
    with pytest.raises(users.UnknownToken):
        users.user_for_token(store, token)


def test_a_role_change_against_a_stale_role_is_refused(store):
    users.ensure_user(store, "val", Role.VIEWER)
    users.set_role(store, "val", Role.ADMIN, expected=Role.VIEWER)
    with pytest.raises(users.RoleChanged, match="val's role was changed to admin meanwhile"):
        users.set_role(store, "val", Role.OPERATOR, expected=Role.VIEWER)
    assert users.get_user(store, "val").role == "admin"


def test_an_older_users_table_gets_the_generation_column(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE user (name VARCHAR(200) PRIMARY KEY, role VARCHAR, created_at FLOAT, "
                     "last_seen_at FLOAT)")
        conn.execute("INSERT INTO user VALUES ('ann', 'operator', 1.0, NULL)")
    store = Store(f"sqlite:///{path}")
    assert (users.get_user(store, "ann").role, users.get_user(store, "ann").session_generation) == ("operator", 0)
    assert users.session_user(store, "ann", 0) is not None
    store.engine.dispose()


# ====================================================================== only failures count
def test_only_wrong_passwords_count_towards_the_sign_in_limit(client, monkeypatch):
    monkeypatch.setattr(signin, "time", SimpleNamespace(monotonic=lambda: 1000.0))  # the service's clock stands still
    for _ in range(3 * signin.FailedSignIns.MAX_FAILURES):  # a team behind one address, all signing in
        assert sign_in(client, "ann").status_code == 303
    statuses = [sign_in(client, "mallory", "guess").status_code for _ in range(signin.FailedSignIns.MAX_FAILURES + 2)]
    assert statuses == [401] * signin.FailedSignIns.MAX_FAILURES + [429, 429]
    refused = sign_in(client, "ann")  # the right password waits too: guesses during the pause learn nothing
    assert refused.status_code == 429 and refused.headers["retry-after"] == "60"
    assert "Too many wrong passwords from your address: try again in 60 s." in refused.text
    assert sign_in(client, "ann", address="198.51.100.2").status_code == 303  # other addresses are not affected


def test_the_failure_window_ages_out(monkeypatch):
    limit, clock = signin.FailedSignIns(), 1000.0
    for _ in range(limit.MAX_FAILURES):
        limit.failed("a", clock)
    assert limit.wait_s("a", clock + 1) == limit.WINDOW_S - 1
    assert limit.wait_s("a", clock + limit.WINDOW_S + 1) == 0.0
    assert limit.wait_s("b", clock) == 0.0


def test_nginx_sends_no_page_to_a_frame_and_does_not_count_sign_ins(tmp_path):
    conf = nginx.render(nginx.Layout("127.0.0.1", 8443, 1, 2, 3, tmp_path))
    assert "add_header X-Frame-Options DENY always;" in conf
    assert "add_header Content-Security-Policy \"frame-ancestors 'none'\" always;" in conf
    assert "add_header X-Content-Type-Options nosniff always;" in conf
    assert "limit_req" not in conf  # successful sign-ins never count; the sign-in service counts failures
    assert "proxy_set_header X-Studio-Session $studio_session;" in conf
    api = conf[conf.index("location /v1/ {"):conf.index("location = /_stcore/stream")]
    assert "proxy_pass http://api;" in api and "auth_request" not in api  # the API checks its own tokens


# ====================================================================== OIDC redirect
def test_oidc_needs_the_public_url_and_never_takes_the_host_header(store):
    oidc = {"FINETUNE_STUDIO_OIDC_ISSUER": "https://id.example.com", "FINETUNE_STUDIO_OIDC_CLIENT_ID": "studio",
            "FINETUNE_STUDIO_OIDC_CLIENT_SECRET": "x"}
    with pytest.raises(settings.SettingsError, match="FINETUNE_STUDIO_PUBLIC_URL is not set: OIDC sign-in needs"):
        settings.load(oidc, {})
    with run_server_in_thread() as provider:
        cfg = settings.load({**oidc, "FINETUNE_STUDIO_OIDC_ISSUER": f"http://localhost:{provider.server_port}",
                             "FINETUNE_STUDIO_PUBLIC_URL": "https://studio.example.com"}, {})
        app = signin.create_app(cfg, store, KEY, secure=True)
        with TestClient(app, base_url="https://studio.example.com") as client:
            response = client.get("/auth/login?next=/history", follow_redirects=False,
                                  headers={"Host": "evil.example", "X-Forwarded-Proto": "https"})
    assert response.status_code == 302
    query = parse_qs(urlsplit(response.headers["location"]).query)
    assert query["redirect_uri"] == ["https://studio.example.com/auth/callback"]


# ====================================================================== the dashboard ends sessions too
def _as_session(monkeypatch, name: str, generation: int | None) -> None:
    monkeypatch.setenv(auth.SHARED_ENV, "1")
    monkeypatch.setattr(auth, "proxy_user", lambda: name)
    monkeypatch.setattr(auth, "proxy_session", lambda: generation)


@pytest.mark.parametrize("end", ["sign out", "remove", "lower role"])
def test_an_open_dashboard_session_ends_when_the_user_is_signed_out_removed_or_lowered(app_home, monkeypatch, end):
    store = get_orchestrator().store
    ann = users.ensure_user(store, "ann", Role.OPERATOR)
    _as_session(monkeypatch, "ann", ann.session_generation)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("pages/history.py").run()
    assert [t.value for t in at.title] == ["History"] and not at.error
    {"sign out": lambda: users.end_sessions(store, "ann"), "remove": lambda: users.delete_user(store, "ann"),
     "lower role": lambda: users.set_role(store, "ann", Role.VIEWER)}[end]()
    at.run()  # the same session (its WebSocket's headers never change) on its next rerun
    assert [e.value for e in at.error] == [auth.SESSION_ENDED]
    assert not at.title and not at.sidebar.markdown


def test_the_dashboard_refuses_a_session_without_a_generation(app_home, monkeypatch):
    users.ensure_user(get_orchestrator().store, "ann", Role.OPERATOR)
    _as_session(monkeypatch, "ann", None)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert [e.value for e in at.error] == [auth.SESSION_ENDED] and not at.title


# ====================================================================== Account page: explicit role changes
@pytest.fixture
def admins(app_home, monkeypatch):
    store = get_orchestrator().store
    ada = users.ensure_user(store, "ada", Role.ADMIN)
    users.ensure_user(store, "val", Role.VIEWER)
    _as_session(monkeypatch, "ada", ada.session_generation)
    return store


def account_tab() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("pages/account.py").run()
    assert not at.exception, at.exception
    return at


def click(at: AppTest, key: str) -> AppTest:
    at.button(key=key).click().run()
    assert not at.exception, at.exception
    return at


def test_a_role_changes_only_by_a_click_on_the_role_shown(admins):
    at = account_tab()
    assert at.button(key="role_val_operator").label == "Make operator"
    assert [b.key for b in at.button if b.key and b.key.startswith("role_ada")] == []  # not your own
    click(at, "role_val_operator")
    assert users.get_user(admins, "val").role == "operator"
    assert [s.value for s in at.success] == [safe("val was viewer and is now operator.")]
    at.run()
    at.run()  # reruns, other clicks: the role stays
    click(at, "role_val_viewer")
    assert users.get_user(admins, "val").role == "viewer"
    assert [s.value for s in at.success] == [
        safe("val was operator and is now viewer. Their sessions and API tokens ended.")]


@pytest.mark.parametrize("newer, stale", [("role_val_admin", "role_val_operator"),
                                          ("role_val_operator", "role_val_admin")])
def test_a_click_in_an_older_tab_is_refused_not_reapplied(admins, newer, stale):
    old_tab, new_tab = account_tab(), account_tab()
    click(new_tab, newer)
    decided = users.get_user(admins, "val").role
    click(old_tab, stale)  # drawn when val was a viewer
    assert users.get_user(admins, "val").role == decided
    assert [w.value for w in old_tab.warning] == [safe(
        f"val's role was changed to {decided} meanwhile (not viewer); nothing was changed: look again and choose")]
    assert [b.key for b in old_tab.button if b.key and b.key.startswith("role_val_")] == [
        f"role_val_{r.value}" for r in Role if r.value != decided]  # redrawn with the stored role
    next(b for b in old_tab.button if b.label == "Create token").click().run()  # an unrelated click
    assert not old_tab.exception
    assert users.get_user(admins, "val").role == decided


def test_adding_an_existing_user_applies_the_role_asked_for(admins):
    at = account_tab()
    next(t for t in at.text_input if t.label == "Add a user").input("val")
    next(s for s in at.selectbox if s.label == "Role").set_value("operator")
    next(b for b in at.button if b.label == "Add").click().run()
    assert not at.exception, at.exception
    assert users.get_user(admins, "val").role == "operator"
    assert [s.value for s in at.success] == [safe("val was viewer and is now operator.")]
    at.run()
    assert users.get_user(admins, "val").role == "operator"


def test_removing_a_user_from_the_account_page(admins):
    token = users.create_token(admins, "val")
    at = click(account_tab(), "remove_val")
    assert users.get_user(admins, "val") is None
    with pytest.raises(users.UnknownToken):
        users.user_for_token(admins, token)
    assert "remove_val" not in [b.key for b in at.button]


def test_a_click_from_someone_no_longer_admin_changes_nothing(admins):
    at = account_tab()
    users.ensure_user(admins, "root", Role.ADMIN)
    users.set_role(admins, "ada", Role.OPERATOR)  # ada's session ends with it
    click(at, "role_val_admin")
    assert users.get_user(admins, "val").role == "viewer"


# ====================================================================== the supervisor's children
def nginx_or_skip() -> None:
    if not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists() or os.environ.get("FINETUNE_STUDIO_NGINX")):
        pytest.skip("nginx not found: install Debian's nginx package (.ci/run does) or set FINETUNE_STUDIO_NGINX")


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def supervisor(tmp_path):
    """``python -m gateway`` as ``make share`` runs it, up and answering; yields (process, its children)."""
    nginx_or_skip()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FINETUNE_STUDIO_") and k != "DATABASE_URL"}
    env.update(FINETUNE_STUDIO_HOME=str(tmp_path / "home"), FINETUNE_STUDIO_FORCE_CPU="1",
               FINETUNE_STUDIO_PASSWORD=PASSWORD)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "--port", str(port), "--host", "127.0.0.1"], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    children: list[psutil.Process] = []
    try:
        def answering() -> bool:
            assert proc.poll() is None, f"the supervisor exited with {proc.returncode}"
            try:
                return _status(f"http://127.0.0.1:{port}/") == 302
            except OSError:
                return False
        wait_until(answering, timeout=120, what="make share to answer")
        children = psutil.Process(proc.pid).children(recursive=True)
        commands = [" ".join(c.cmdline()) for c in children]
        assert any("gateway.signin" in c for c in commands) and any("ui.serve" in c for c in commands)
        assert any("nginx" in c for c in commands), commands
        yield proc, children
    finally:
        for child in [*children, psutil.Process(proc.pid) if proc.poll() is None else None]:
            if child is not None and alive(child):
                child.kill()
        proc.wait(timeout=30)


def test_a_burst_of_signals_still_stops_every_child(supervisor):
    proc, children = supervisor
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):  # make and its child signalled, Ctrl-C twice
        os.kill(proc.pid, sig)
    assert proc.wait(timeout=60) == 0
    wait_until(lambda: not any(alive(c) for c in children), timeout=30, what="every child to end")


def test_children_die_with_a_sigkilled_supervisor(supervisor):
    proc, children = supervisor
    proc.kill()
    proc.wait(timeout=30)
    wait_until(lambda: not any(alive(c) for c in children), timeout=30, what="every child to end")


def test_sighup_means_stop_too(supervisor):
    proc, children = supervisor
    os.kill(proc.pid, signal.SIGHUP)  # the terminal closed
    assert proc.wait(timeout=60) == 0
    wait_until(lambda: not any(alive(c) for c in children), timeout=30, what="every child to end")
