"""Helpers for driving the real dashboard in headless Chromium: find the browser (the ``chromium`` and ``page``
fixtures), run `streamlit run` on a free port with its own data root (``served_dashboard``), read the loss chart and
the History table out of the DOM, and clean up afterwards."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.env import MODELS_CACHE, ROOT

CHROMIUM_ENV = "FINETUNE_STUDIO_CHROMIUM"
CHROMIUM_NAMES = ("chromium", "chromium-browser")
VIEWPORT = {"width": 1400, "height": 1000}
PAGE_TIMEOUT_S = 60  # a page or widget to appear (the first script run imports pandas/altair)

# Vega-Lite gives every mark an ARIA label such as "step: 3; loss: 3.53; series: train loss" (the tooltip
# fields, or the encoded fields when the mark has no tooltip). Reading it needs no access to the vega
# view, and it is the data actually drawn, after downsampling.
CHART_MARK_LABELS_JS = """() => Array.from(document.querySelectorAll(
    '[data-testid="stMain"] [data-testid="stVegaLiteChart"] [role="graphics-symbol"]'))
    .map(e => e.getAttribute("aria-label") || "")"""

# st.dataframe draws on a canvas; glide-data-grid keeps an accessible copy of the visible cells in a
# <table role="grid"> inside the canvas, which is what screen readers (and this test) read.
GRID_ROWS_JS = """() => Array.from(document.querySelectorAll('[data-testid="stDataFrame"] table[role="grid"]'))
    .flatMap(table => {
        const headers = Array.from(table.querySelectorAll('thead th')).map(th => th.textContent.trim());
        return Array.from(table.querySelectorAll('tbody tr')).map(tr => Object.fromEntries(
            Array.from(tr.querySelectorAll('td')).map((td, i) => [headers[i] ?? String(i), td.textContent.trim()])));
    })"""


def chromium_path() -> str | None:
    """The browser to drive: ``$FINETUNE_STUDIO_CHROMIUM``, else ``chromium``/``chromium-browser`` on PATH."""
    configured = os.environ.get(CHROMIUM_ENV)
    if configured:
        return configured
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def free_port() -> int:
    """A localhost port nobody listens on right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class StreamlitServer:
    """``streamlit run streamlit_app.py`` (through ``python -m ui.serve``, or ``module``, a test's wrapper of it)
    in its own process group, logging to ``log_path``."""

    def __init__(self, root: Path, env: dict[str, str], log_path: Path, port: int | None = None,
                 module: str = "ui.serve"):
        self.root, self.env, self.log_path, self.module = root, env, log_path, module
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, "--server.port", str(self.port),
                 "--server.address", "127.0.0.1", "--server.headless", "true",
                 "--browser.gatherUsageStats", "false"],
                cwd=self.root, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)  # own group: stop() can end it and anything it spawned in-session
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"streamlit exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.3)
        raise AssertionError(f"streamlit was not healthy within {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return "(no server log)"


@contextlib.contextmanager
def served_dashboard(tmp_path: Path, module: str = "ui.serve", **env_values: str) -> Iterator[StreamlitServer]:
    """The dashboard (``module``: ui.serve or a test's wrapper of it) on a free port with its own data root under
    ``tmp_path``, on the CPU, with the shared models cache, the default store and no password gate, then
    ``env_values`` (a password, say); stopped, with any worker it left, at the end."""
    home = tmp_path / "home"
    env = {name: value for name, value in os.environ.items()
           if name not in ("DATABASE_URL", "FINETUNE_STUDIO_PASSWORD")}  # the default store, no password gate
    env.update({"FINETUNE_STUDIO_HOME": str(home), "FINETUNE_STUDIO_MODELS": str(MODELS_CACHE),
                "FINETUNE_STUDIO_FORCE_CPU": "1",
                "FINETUNE_STUDIO_ALLOWED_ROOTS": os.pathsep.join([str(tmp_path), str(ROOT / ".test-cache")]),
                **env_values})
    server = StreamlitServer(ROOT, env, tmp_path / "server.log", module=module)
    try:
        server.start(timeout=PAGE_TIMEOUT_S)
        yield server
    finally:
        server.stop()
        kill_workers_under(home)


@pytest.fixture
def chromium() -> str:
    path = chromium_path()
    if path is None:
        pytest.skip(f"Chromium not found: install Debian's `chromium` package (apt-get install chromium; "
                    f".ci/run does) or set {CHROMIUM_ENV} to the browser's path")
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is not an executable file: fix {CHROMIUM_ENV} or the PATH entry")
    return path


@pytest.fixture
def page(chromium):
    """A tab of headless Chromium (VIEWPORT, every wait up to PAGE_TIMEOUT_S)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is missing: pip install -e '.[dev]'")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True)
        try:
            context = browser.new_context(viewport=VIEWPORT)
            tab = context.new_page()
            tab.set_default_timeout(PAGE_TIMEOUT_S * 1000)
            yield tab
        finally:
            browser.close()


def kill_workers_under(root: Path) -> list[int]:
    """SIGKILL the process group of every training worker whose run folder lies under ``root``.

    Workers start in their own session on purpose (they outlive the server), so stopping the server
    does not reach them. Returns the pids it killed.
    """
    prefix = str(root)
    killed = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "trainer_core.worker" in cmd and any(arg.startswith(prefix) for arg in cmd):
            try:
                os.killpg(proc.info["pid"], signal.SIGKILL)
                killed.append(proc.info["pid"])
            except (ProcessLookupError, PermissionError):
                pass
    return killed


def parse_mark_label(label: str) -> dict[str, str]:
    """``"step: 3; loss: 3.5; series: train loss"`` -> ``{"step": "3", "loss": "3.5", "series": "train loss"}``."""
    fields = {}
    for part in label.split("; "):
        key, sep, value = part.partition(": ")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def series_steps(page, series: str) -> list[int]:
    """Sorted steps of the points of one series drawn in the main area's Vega-Lite charts."""
    steps = set()
    for label in page.evaluate(CHART_MARK_LABELS_JS):
        fields = parse_mark_label(label)
        if fields.get("series") == series and "step" in fields:
            steps.add(int(float(fields["step"].replace(",", ""))))
    return sorted(steps)


def chart_labels_sample(page, limit: int = 8) -> list[str]:
    return page.evaluate(CHART_MARK_LABELS_JS)[:limit]


def grid_rows(page) -> list[dict[str, str]]:
    """Visible rows of the page's dataframes as ``{column title: cell text}``."""
    return page.evaluate(GRID_ROWS_JS)


def main_text(page) -> str:
    """Text of the main area (not the sidebar); empty while the page is still loading."""
    main = page.locator('[data-testid="stMain"]')
    return main.inner_text() if main.count() else ""


def page_exception(page) -> str | None:
    """The text of a Streamlit exception box on the page, if a script raised."""
    boxes = page.locator('[data-testid="stException"]')
    return "\n".join(boxes.all_inner_texts()) if boxes.count() else None


def wait_until(page, check: Callable[[], object], timeout: float, what: str,
               diagnostics: Callable[[], str], poll_ms: int = 500):
    """Poll ``check`` until it returns something truthy; fail with ``diagnostics()`` on timeout or when the
    page shows a Streamlit exception. Waiting through ``page.wait_for_timeout`` keeps the browser serviced."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        error = page_exception(page)
        if error:
            raise AssertionError(f"the page raised while waiting for {what}:\n{error}\n{diagnostics()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{diagnostics()}")
        page.wait_for_timeout(poll_ms)
