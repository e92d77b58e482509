"""The shared mode end to end: nginx + the sign-in service + Streamlit on loopback, started the way
``make share`` starts them (gateway.__main__.Share), driven over HTTP and with headless Chromium.

Password mode: nothing of Streamlit answers without a session (pages, /media, uploads, the WebSocket,
metrics, health); a page of another origin on the same host (whose requests carry the session cookie,
since cookies ignore ports) cannot open the WebSocket; uploads are capped; sign-in posts are rate
limited; a forged X-Studio-User header is overwritten; a viewer cannot press Stop on someone else's run.
OIDC mode, against the oidc-provider-mock package: the round trip lands on the deep link asked for.
"""
from __future__ import annotations

import datetime
import http.client
import json
import itertools
import os
import shutil
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlencode

import psutil
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from oidc_provider_mock import run_server_in_thread

from db import users
from db.entities import RunRecord
from db.store import Store
from gateway.__main__ import Share
from tests.support.browser import CHROMIUM_ENV, chromium_path, free_port, kill_workers_under
from trainer_core.auth.access import Role
from trainer_core.protocol.status import RunStatus

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.gateway  # nginx in front of the sign-in service and Streamlit

PASSWORD = "team password 42"
BOB_RUN = "20250101-000000-b0b0b0"
TIMEOUT_S = 90


def nginx_or_skip() -> None:
    if not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists() or os.environ.get("FINETUNE_STUDIO_NGINX")):
        pytest.skip("nginx not found: install Debian's nginx package (.ci/run does) or set FINETUNE_STUDIO_NGINX")


def chromium_or_skip() -> str:
    path = chromium_path()
    if path is None:
        pytest.skip(f"Chromium not found: install Debian's chromium package or set {CHROMIUM_ENV}")
    return path


def share_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FINETUNE_STUDIO_") and k != "DATABASE_URL"}
    env.update(FINETUNE_STUDIO_HOME=str(home), FINETUNE_STUDIO_FORCE_CPU="1", **extra)
    return env


_sources = itertools.count(10)


def fresh_source() -> str:
    """A loopback address of its own (all of 127/8 is this host): sign-in posts are rate limited per address,
    so each test's sign-ins get their own budget whatever ran before."""
    return f"127.0.0.{next(_sources)}"


def request(share: Share, method: str, path: str, headers: dict[str, str] | None = None,
            body: bytes | None = None, source: str = "127.0.0.1") -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", share.port, timeout=20, source_address=(source, 0))
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


def sign_in(share: Share, name: str, password: str = PASSWORD) -> str:
    body = urlencode({"name": name, "password": password, "next": "/"}).encode()
    response = request(share, "POST", "/auth/login", {"Content-Type": "application/x-www-form-urlencoded"}, body,
                       source=fresh_source())
    assert response.status == 303, response.status
    return response.getheader("Set-Cookie").split(";", 1)[0]


@pytest.fixture(scope="module")
def password_share(tmp_path_factory):
    """One shared server for the module: a viewer (val), an operator (bob) and a run of bob's 'training'."""
    nginx_or_skip()
    home = tmp_path_factory.mktemp("share") / "home"
    env = share_env(home, FINETUNE_STUDIO_PASSWORD=PASSWORD)
    busy = subprocess.Popen(["sleep", "600"], start_new_session=True)  # plays bob's worker process
    home.mkdir(parents=True)
    store = Store(f"sqlite:///{home / 'studio.db'}")  # the database the shared server will use
    users.ensure_user(store, "val", Role.VIEWER)
    users.ensure_user(store, "bob", Role.OPERATOR)
    store.create_run(RunRecord(id=BOB_RUN, name="bob's run", owner="bob", status=RunStatus.RUNNING.value,
                         created_at=time.time(), started_at=time.time(), pid=busy.pid,
                         pid_started_at=psutil.Process(busy.pid).create_time(), devices="cpu", total_steps=100))
    (home / "runs" / BOB_RUN).mkdir(parents=True)
    store.engine.dispose()
    share = Share(free_port(), host="127.0.0.1", env=env)
    try:
        share.start(timeout=TIMEOUT_S)
        yield share
    finally:
        share.stop()
        busy.kill()
        busy.wait()
        kill_workers_under(home)


# ====================================================================== HTTP: nothing answers unauthenticated
@pytest.mark.parametrize("method, path", [
    ("GET", "/"), ("GET", "/history"), ("GET", "/run?run=x"), ("GET", "/media/0123456789abcdef.csv"),
    ("GET", "/_stcore/metrics"), ("GET", "/_stcore/health"), ("GET", "/_stcore/host-config"),
    ("GET", "/static/js/index.js"), ("PUT", "/_stcore/upload_file/session/file"),
])
def test_nothing_of_streamlit_answers_without_a_session(password_share, method, path):
    response = request(password_share, method, path, body=b"x" * 1000 if method == "PUT" else None)
    assert response.status == 401, (path, response.status)
    page = request(password_share, "GET", path, {"Accept": "text/html"})
    if path.startswith(("/_stcore/", "/media/", "/static/")):
        assert page.status == 401  # no redirect dance for resources
    else:  # a page load goes to the sign-in page and remembers where it was going
        assert page.status == 302
        assert page.getheader("Location") == "/auth/login?" + urlencode({"next": path})


@pytest.mark.parametrize("announced_mb, status", [(100, 401), (400, 413)])
def test_an_upload_without_a_session_is_refused_before_its_body_is_read(password_share, announced_mb, status):
    """The answer comes while the client has sent none of the body: nothing is held for a stranger."""
    conn = http.client.HTTPConnection("127.0.0.1", password_share.port, timeout=20)
    conn.putrequest("PUT", "/_stcore/upload_file/session/file")
    conn.putheader("Content-Length", str(announced_mb << 20))
    conn.endheaders()
    assert conn.getresponse().status == status  # over the cap: refused on the header alone
    conn.close()


def test_signed_in_requests_pass_and_uploads_over_the_cap_are_refused(password_share):
    cookie = sign_in(password_share, "val")
    assert request(password_share, "GET", "/_stcore/health", {"Cookie": cookie}).status == 200
    conn = http.client.HTTPConnection("127.0.0.1", password_share.port, timeout=20)
    conn.putrequest("PUT", "/_stcore/upload_file/session/file")
    conn.putheader("Cookie", cookie)
    conn.putheader("Content-Length", str(201 << 20))
    conn.endheaders()
    assert conn.getresponse().status == 413
    conn.close()


def test_the_websocket_needs_this_sites_origin(password_share):
    cookie = sign_in(password_share, "val")
    upgrade = {"Cookie": cookie, "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
               "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    own = f"http://127.0.0.1:{password_share.port}"
    assert request(password_share, "GET", "/_stcore/stream", {**upgrade, "Origin": "http://127.0.0.1:1"}).status == 403
    assert request(password_share, "GET", "/_stcore/stream", upgrade).status == 403  # no Origin at all
    conn = http.client.HTTPConnection("127.0.0.1", password_share.port, timeout=20)
    conn.request("GET", "/_stcore/stream", headers={**upgrade, "Origin": own})
    assert conn.getresponse().status == 101
    conn.close()


def test_internal_endpoints_are_not_reachable_and_bad_passwords_are_rate_limited(password_share):
    assert request(password_share, "GET", "/auth/check").status == 404
    assert request(password_share, "GET", "/auth/start").status == 404
    body = urlencode({"name": "mallory", "password": "guess", "next": "/"}).encode()
    attacker, other = fresh_source(), fresh_source()
    statuses = [request(password_share, "POST", "/auth/login", {"Content-Type": "application/x-www-form-urlencoded"},
                        body, source=attacker).status for _ in range(12)]
    assert statuses[0] == 401 and statuses[-1] == 429, statuses  # 5 wrong passwords a minute, per address
    assert set(statuses) == {401, 429}
    # ... and the right password from that address is refused too while the limit holds; other addresses pass
    good = urlencode({"name": "val", "password": PASSWORD, "next": "/"}).encode()
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    assert request(password_share, "POST", "/auth/login", form, good, source=attacker).status == 429
    assert request(password_share, "POST", "/auth/login", form, good, source=other).status == 303


def test_successful_sign_ins_never_count_towards_the_limit(password_share):
    """A team behind one address signing in at nine: only wrong passwords are limited (issue 24)."""
    source = fresh_source()
    good = urlencode({"name": "val", "password": PASSWORD, "next": "/"}).encode()
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    assert [request(password_share, "POST", "/auth/login", form, good, source=source).status
            for _ in range(15)] == [303] * 15


def test_no_page_may_be_framed_by_another_site(password_share):
    cookie = sign_in(password_share, "val")
    for path, headers in (("/", {"Cookie": cookie, "Accept": "text/html"}), ("/auth/login", {}),
                          ("/", {"Accept": "text/html"})):
        response = request(password_share, "GET", path, headers)
        assert response.getheader("X-Frame-Options") == "DENY", path
        assert response.getheader("Content-Security-Policy") == "frame-ancestors 'none'", path
        assert response.getheader("X-Content-Type-Options") == "nosniff", path


def test_sign_out_takes_a_post_with_its_token_and_the_cookie_stops_working(password_share):
    cookie = sign_in(password_share, "val")
    other_browser = sign_in(password_share, "val")
    page = http.client.HTTPConnection("127.0.0.1", password_share.port, timeout=20)
    page.request("GET", "/auth/logout", headers={"Cookie": cookie})
    response = page.getresponse()
    form = response.read().decode()
    page.close()
    assert response.status == 200  # a GET only asks
    assert request(password_share, "GET", "/_stcore/health", {"Cookie": cookie}).status == 200
    token = form.split('name="token" value="', 1)[1].split('"', 1)[0]
    body = urlencode({"token": token}).encode()
    out = request(password_share, "POST", "/auth/logout", {"Cookie": cookie,
                                                           "Content-Type": "application/x-www-form-urlencoded"}, body)
    assert out.status == 303 and out.getheader("Location") == "/auth/login"
    for ended in (cookie, other_browser):  # a copy of the cookie is refused as well
        assert request(password_share, "GET", "/_stcore/health", {"Cookie": ended}).status == 401


def test_a_removed_users_cookie_stops_working_at_once(password_share):
    cookie = sign_in(password_share, "temp")
    assert request(password_share, "GET", "/_stcore/health", {"Cookie": cookie}).status == 200
    store = Store(f"sqlite:///{password_share.run_dir.parent / 'studio.db'}")
    assert users.delete_user(store, "temp")
    store.engine.dispose()
    assert request(password_share, "GET", "/_stcore/health", {"Cookie": cookie}).status == 401


def test_sign_in_only_redirects_to_this_site(password_share):
    for target, expected in (("/compare?run=a&run=b", "/compare?run=a&run=b"), ("//evil.example/x", "/"),
                             ("https://evil.example", "/"), ("/\\evil.example", "/")):
        body = urlencode({"name": "val", "password": PASSWORD, "next": target}).encode()
        response = request(password_share, "POST", "/auth/login", {"Content-Type": "application/x-www-form-urlencoded"},
                           body, source=fresh_source())
        assert response.status == 303 and response.getheader("Location") == expected, target


def test_the_dashboard_process_holds_no_secret(password_share):
    streamlit = password_share.procs["streamlit"]
    environ = Path(f"/proc/{streamlit.pid}/environ").read_bytes()
    assert PASSWORD.encode() not in environ and b"FINETUNE_STUDIO_PASSWORD" not in environ
    assert b"FINETUNE_STUDIO_SHARED=1" in environ.split(b"\0")
    cmdline = Path(f"/proc/{streamlit.pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[cmdline.index(b"--server.address") + 1] == b"127.0.0.1"  # behind nginx only
    assert b"--secrets.files" in cmdline  # never reads secrets.toml (it would copy the password into its environment)
    for log in password_share.run_dir.glob("*.log"):
        assert PASSWORD not in log.read_text(errors="replace"), log


def test_the_fine_tuning_api_answers_under_v1_with_a_token_only(password_share):
    """/v1/ goes to the API server (gateway/api.py), which wants an API token: a dashboard session is not one."""
    cookie = sign_in(password_share, "bob")
    for headers in ({}, {"Cookie": cookie}):
        response = request(password_share, "GET", "/v1/fine_tuning/jobs", headers)
        assert response.status == 401
    store = Store(f"sqlite:///{password_share.run_dir.parent / 'studio.db'}")
    token = users.create_token(store, "bob", "api test")
    store.engine.dispose()
    conn = http.client.HTTPConnection("127.0.0.1", password_share.port, timeout=60)
    conn.request("GET", "/v1/fine_tuning/jobs", headers={"Authorization": f"Bearer {token}"})
    answer = conn.getresponse()
    assert answer.status == 200 and json.loads(answer.read()) == {"object": "list", "data": [], "has_more": False,
                                                                  "first_id": None, "last_id": None}
    conn.close()
    environ = Path(f"/proc/{password_share.procs['api'].pid}/environ").read_bytes()
    assert PASSWORD.encode() not in environ and b"FINETUNE_STUDIO_PASSWORD" not in environ
    assert "bob GET /v1/fine_tuning/jobs -> 200" in password_share.log_tail("api")


# ====================================================================== the browser through the proxy
@pytest.fixture
def browser(password_share):
    executable = chromium_or_skip()
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def browser_sign_in(page, share: Share, path: str, name: str) -> None:
    page.goto(f"{share.url}{path}")
    page.get_by_label("Your name").fill(name)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{share.url}{path}", timeout=TIMEOUT_S * 1000)


class _EvilPage(BaseHTTPRequestHandler):
    """Another site on the same host: its requests to the studio carry the studio's cookie (ports do not
    separate cookies), so only the proxy's Origin check stands between it and the WebSocket."""

    target = ""

    def do_GET(self):  # noqa: N802 (http.server's naming)
        page = f"""<!doctype html><script>
            window.outcome = "pending";
            const ws = new WebSocket("{self.target}");
            ws.onopen = () => {{ window.outcome = "open"; ws.close(); }};
            ws.onerror = () => {{ if (window.outcome === "pending") window.outcome = "refused"; }};
            </script>""".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *args):
        pass


@pytest.mark.browser
def test_a_page_of_another_origin_cannot_open_the_websocket(password_share, browser):
    context = browser.new_context()
    page = context.new_page()
    browser_sign_in(page, password_share, "/history", "val")
    page.get_by_role("heading", name="History").wait_for(timeout=TIMEOUT_S * 1000)
    ws_url = f"ws://127.0.0.1:{password_share.port}/_stcore/stream"
    _EvilPage.target = ws_url
    evil = ThreadingHTTPServer(("127.0.0.1", 0), _EvilPage)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        other = context.new_page()  # same browser, same cookies: the victim's
        other.goto(f"http://127.0.0.1:{evil.server_address[1]}/")
        other.wait_for_function("window.outcome !== 'pending'", timeout=TIMEOUT_S * 1000)
        assert other.evaluate("window.outcome") == "refused"
        access_log = (password_share.run_dir / "nginx-access.log").read_text()
        assert '"GET /_stcore/stream HTTP/1.1" 403' in access_log  # refused by the Origin check, cookie and all
        # The same script from the studio's own origin opens it: the difference is the Origin alone.
        page.evaluate("""(url) => new Promise(done => { const ws = new WebSocket(url);
            ws.onopen = () => { window.own = "open"; ws.close(); done(); };
            ws.onerror = () => { window.own = "refused"; done(); }; })""", ws_url)
        assert page.evaluate("window.own") == "open"
    finally:
        evil.shutdown()
        evil.server_close()
        context.close()


@pytest.mark.browser
def test_unauthenticated_browser_requests_for_media_and_uploads_are_refused(password_share, browser):
    context = browser.new_context()
    try:
        api = context.request
        assert api.get(f"{password_share.url}/media/0123456789abcdef0123456789abcdef.csv").status == 401
        assert api.put(f"{password_share.url}/_stcore/upload_file/session/file", data=b"x" * 4096).status == 401
        assert api.post(f"{password_share.url}/_stcore/upload_file/session/file", multipart={
            "file": {"name": "a.jsonl", "mimeType": "application/json", "buffer": b"{}\n"}}).status == 401
    finally:
        context.close()


@pytest.mark.browser
def test_a_signed_in_viewer_cannot_stop_someone_elses_run_nor_pretend_to_be_someone_else(password_share, browser):
    # A forged identity header on every request, WebSocket included: nginx replaces it with the session's.
    context = browser.new_context(extra_http_headers={"X-Studio-User": "bob"})
    page = context.new_page()
    try:
        browser_sign_in(page, password_share, "/live", "val")
        page.get_by_role("heading", name="bob's run").wait_for(timeout=TIMEOUT_S * 1000)
        page.get_by_text("Signed in as val (viewer)").wait_for(timeout=TIMEOUT_S * 1000)
        stop = page.get_by_role("button", name="Stop & save")
        assert stop.is_disabled()
        assert page.get_by_role("button", name="Cancel").is_disabled()
        stop.click(force=True)  # a click on the disabled button changes nothing
        page.wait_for_timeout(1000)
        store = Store(f"sqlite:///{password_share.run_dir.parent / 'studio.db'}")
        assert store.get_run(BOB_RUN).status == RunStatus.RUNNING.value
        assert [e.kind for e in store.get_events(BOB_RUN)] == ["status"]
        store.engine.dispose()
    finally:
        context.close()


def test_signing_out_ends_an_open_dashboard_tab_over_its_websocket(password_share, browser):
    """The tab's WebSocket was opened with the old session: its next rerun says the session ended."""
    context = browser.new_context()
    try:
        tab = context.new_page()
        browser_sign_in(tab, password_share, "/history", "val")
        tab.get_by_role("heading", name="History").wait_for(timeout=TIMEOUT_S * 1000)
        other = context.new_page()
        other.goto(f"{password_share.url}/auth/logout")  # where Sign out links to: a GET asks, nothing ends yet
        other.get_by_role("button", name="Sign out").click()
        other.get_by_label("Your name").wait_for(timeout=TIMEOUT_S * 1000)  # back at the sign-in form
        tab.get_by_test_id("stSidebarNavItems").get_by_role("link", name="Live").click()  # a rerun over the old WebSocket
        tab.get_by_text("Your session has ended").wait_for(timeout=TIMEOUT_S * 1000)
        assert tab.get_by_role("heading", name="Live").count() == 0
    finally:
        context.close()


# ====================================================================== OIDC against a mock provider
@pytest.mark.browser
def test_oidc_round_trip_lands_on_the_deep_link(tmp_path):
    nginx_or_skip()
    executable = chromium_or_skip()
    with run_server_in_thread() as provider:
        issuer = f"http://localhost:{provider.server_port}"
        port = free_port()
        env = share_env(tmp_path / "home", FINETUNE_STUDIO_OIDC_ISSUER=issuer, FINETUNE_STUDIO_OIDC_CLIENT_ID="studio",
                        FINETUNE_STUDIO_OIDC_CLIENT_SECRET="mock-client-secret", FINETUNE_STUDIO_ADMINS="olga@example.com",
                        FINETUNE_STUDIO_PUBLIC_URL=f"http://127.0.0.1:{port}")  # required in OIDC mode (issue 24)
        share = Share(port, host="127.0.0.1", env=env)
        try:
            share.start(timeout=TIMEOUT_S)
            with sync_api.sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=executable, headless=True)
                try:
                    page = browser.new_page()
                    deep_link = f"{share.url}/compare?run=run-a&run=run-b"
                    page.goto(deep_link)
                    page.wait_for_url(f"{issuer}/**", timeout=TIMEOUT_S * 1000)  # at the provider
                    page.locator("input[name=sub]").fill("olga@example.com")
                    page.get_by_role("button", name="Authorize").click()
                    page.wait_for_url(deep_link, timeout=TIMEOUT_S * 1000)
                    page.get_by_role("heading", name="Compare runs").wait_for(timeout=TIMEOUT_S * 1000)
                    page.get_by_text("Signed in as olga@example.com (admin)").wait_for(timeout=TIMEOUT_S * 1000)
                finally:
                    browser.close()
        finally:
            share.stop()
    store = Store(f"sqlite:///{tmp_path / 'home' / 'studio.db'}")
    assert [(u.name, u.role) for u in users.list_users(store)] == [("olga@example.com", "admin")]
    store.engine.dispose()
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "home" / "share").glob("*.log"))
    assert "mock-client-secret" not in logs


# ====================================================================== TLS when given a certificate
def self_signed(folder: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "studio.test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_with_a_certificate_it_serves_https_only_and_cookies_are_secure(tmp_path):
    nginx_or_skip()
    cert, key = self_signed(tmp_path)
    env = share_env(tmp_path / "home", FINETUNE_STUDIO_PASSWORD=PASSWORD, FINETUNE_STUDIO_TLS_CERT=str(cert),
                    FINETUNE_STUDIO_TLS_KEY=str(key))
    share = Share(free_port(), host="127.0.0.1", env=env)
    try:
        share.start(timeout=TIMEOUT_S)
        assert share.url.startswith("https://")
        context = ssl.create_default_context(cafile=str(cert))
        context.check_hostname = False  # the certificate names studio.test; the chain is what is checked here
        conn = http.client.HTTPSConnection("127.0.0.1", share.port, timeout=20, context=context)
        body = urlencode({"name": "val", "password": PASSWORD, "next": "/history"}).encode()
        conn.request("POST", "/auth/login", body=body, headers={"Content-Type": "application/x-www-form-urlencoded"})
        response = conn.getresponse()
        response.read()
        assert response.status == 303 and response.getheader("Location") == "/history"
        cookie = response.getheader("Set-Cookie")
        assert "; Secure" in cookie and "HttpOnly" in cookie
        assert response.getheader("Strict-Transport-Security") == "max-age=31536000"
        conn.close()
        plain = http.client.HTTPConnection("127.0.0.1", share.port, timeout=20)  # plain HTTP on the TLS port
        plain.request("GET", "/")
        assert plain.getresponse().status == 400  # nginx: "plain HTTP request was sent to HTTPS port"
        plain.close()
    finally:
        share.stop()


def test_behind_a_tls_terminator_the_public_origin_is_accepted(tmp_path):
    """FINETUNE_STUDIO_PUBLIC_URL: browsers talk to https://studio.example.com, which forwards to nginx."""
    nginx_or_skip()
    env = share_env(tmp_path / "home", FINETUNE_STUDIO_PASSWORD=PASSWORD,
                    FINETUNE_STUDIO_PUBLIC_URL="https://studio.example.com")
    share = Share(free_port(), host="127.0.0.1", env=env)
    try:
        share.start(timeout=TIMEOUT_S)
        body = urlencode({"name": "val", "password": PASSWORD, "next": "/"}).encode()
        response = request(share, "POST", "/auth/login", {"Content-Type": "application/x-www-form-urlencoded",
                                                          "Origin": "https://studio.example.com"}, body)
        assert response.status == 303 and "; Secure" in response.getheader("Set-Cookie")  # the public URL is https
        cookie = response.getheader("Set-Cookie").split(";", 1)[0]
        upgrade = {"Cookie": cookie, "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                   "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                   "Host": "studio.example.com"}  # as the terminator forwards it (Streamlit checks it too)
        conn = http.client.HTTPConnection("127.0.0.1", share.port, timeout=20)
        conn.request("GET", "/_stcore/stream", headers={**upgrade, "Origin": "https://studio.example.com"})
        assert conn.getresponse().status == 101
        conn.close()
        for foreign in ("https://evil.example", "https://studio.example.com.evil.example", "https://studio.example.co"):
            assert request(share, "GET", "/_stcore/stream", {**upgrade, "Origin": foreign}).status == 403, foreign
    finally:
        share.stop()
