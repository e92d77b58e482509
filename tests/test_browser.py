"""The real app in headless Chromium: New run -> Live (loss points, completion) -> History.

`streamlit run` serves the dashboard on a free localhost port with an isolated data root; Playwright
drives Debian's `chromium` (Playwright cannot download its own browser here). `.ci/run` installs it.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.browser import (PAGE_TIMEOUT_S, chart_labels_sample, chromium, grid_rows,  # noqa: F401 - fixtures
                                   main_text, page, served_dashboard, series_steps, wait_until)
from trainer_core.views.charts import RAW_LOSS
from trainer_core.protocol.status import RunStatus
from ui import format as fmt

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is missing: pip install -e '.[dev]'")

pytestmark = [pytest.mark.browser, pytest.mark.train]  # New run trains the tiny model

RUN_NAME = "browser e2e"
MAX_STEPS = 6
# Short rows and small batches, as in test_e2e: the steps stay a few seconds each on 2 CPU cores.
FORM_NUMBERS = {"Max steps": MAX_STEPS, "Max sequence length": 128, "Batch size": 2}
RUN_TIMEOUT_S = 600     # the worker loads (and on a cold cache converts) the model, then trains MAX_STEPS
HISTORY_TIMEOUT_S = 120  # the database row turns terminal once the worker process has exited

COMPLETED = fmt.status_badge(RunStatus.COMPLETED)
FAILED = fmt.status_badge(RunStatus.FAILED)


@pytest.fixture
def dashboard(tmp_path):
    with served_dashboard(tmp_path) as server:
        yield server


def _tails(home: Path, chars: int = 3000) -> str:
    logs = sorted(home.glob("runs/*/worker.log"))
    return "\n".join(f"--- {log}\n{log.read_text(errors='replace')[-chars:]}" for log in logs) or "(no worker log)"


def test_demo_run_from_the_form_to_history(page, dashboard, tmp_path):  # page first: no browser, no server
    home = tmp_path / "home"

    def diagnostics() -> str:
        page.screenshot(path=tmp_path / "failure.png", full_page=True)
        return (f"url: {page.url}\nscreenshot: {tmp_path / 'failure.png'}\n"
                f"chart labels: {chart_labels_sample(page)}\n--- page text\n{main_text(page)[-3000:]}\n"
                f"--- server log\n{dashboard.log_tail()}\n{_tails(home)}")

    # New run: name the run, make it short and cheap, start it.
    page.goto(dashboard.url)
    start = page.get_by_role("button", name="Start training")
    start.wait_for()
    name = page.get_by_role("textbox", name="Run name", exact=True)
    name.fill(RUN_NAME)
    name.press("Tab")  # Streamlit commits a widget's value on blur
    for label, value in FORM_NUMBERS.items():
        field = page.get_by_role("spinbutton", name=label, exact=True)
        field.fill(str(value))
        field.press("Tab")
    for label, value in FORM_NUMBERS.items():
        sync_api.expect(page.get_by_role("spinbutton", name=label, exact=True)).to_have_value(str(value))
    start.click()

    # Live: the page switches by itself; the loss chart fills with points, then the run completes.
    wait_until(page, lambda: page.url.endswith("/live"), PAGE_TIMEOUT_S, "the switch to the Live page", diagnostics)

    def not_failed() -> None:
        if FAILED in main_text(page):
            raise AssertionError(f"the run failed\n{diagnostics()}")

    def points_shown() -> list[int]:
        not_failed()
        return series_steps(page, RAW_LOSS)

    first = wait_until(page, points_shown, RUN_TIMEOUT_S, "points on the loss chart", diagnostics)
    assert RUN_NAME in main_text(page), diagnostics()
    shot = tmp_path / "live-view.png"
    page.screenshot(path=shot)
    print(f"live view screenshot ({len(first)} loss point(s)): {shot}")

    def completed() -> bool:
        not_failed()
        return COMPLETED in main_text(page)

    wait_until(page, completed, RUN_TIMEOUT_S, f"the run to show {COMPLETED!r}", diagnostics)
    everything = list(range(1, MAX_STEPS + 1))  # logging_steps defaults to 1: one point per step
    wait_until(page, lambda: series_steps(page, RAW_LOSS) == everything, PAGE_TIMEOUT_S,
               f"loss points at steps {everything}", diagnostics)
    assert f"step {MAX_STEPS} / {MAX_STEPS}" in main_text(page), diagnostics()

    # History: the run is listed, completed, with every step done.
    # The Live page reruns once when the run ends (to drop Stop/Cancel); a click that lands during that
    # rerun is dropped by Streamlit, as it would be for a user, who clicks again. So does the test.
    def on_history() -> bool:
        if not page.url.endswith("/history"):
            page.get_by_role("link", name="History").click()
            page.wait_for_timeout(1500)
        return page.url.endswith("/history")

    wait_until(page, on_history, PAGE_TIMEOUT_S, "the History page", diagnostics)

    def listed_as_completed() -> list[dict[str, str]]:
        rows = grid_rows(page)
        if rows and rows[0].get("Status") == COMPLETED:
            return rows
        if rows:  # the row turns terminal when the worker exits; History does not refresh by itself
            page.reload()
        return []

    rows = wait_until(page, listed_as_completed, HISTORY_TIMEOUT_S, f"History to list the run as {COMPLETED!r}",
                      lambda: f"rows: {grid_rows(page)}\n{diagnostics()}", poll_ms=1000)
    assert len(rows) == 1, rows
    assert rows[0]["Name"] == RUN_NAME and rows[0]["Steps"] == f"{MAX_STEPS} / {MAX_STEPS}", rows
    picked = page.get_by_role("combobox", name="Run", exact=True)
    assert RUN_NAME in picked.input_value(), picked.input_value()


def test_password_gate_holds_for_a_page_url_and_lets_the_right_password_in(page, tmp_path, chromium):
    """A fresh server, a bookmarked deep link first: the gate shows, refuses a wrong password, lets the
    right one through to the page and query that were asked for, and a second browser session is gated again."""
    with served_dashboard(tmp_path, FINETUNE_STUDIO_PASSWORD="open sesame 42") as server:
        page.goto(f"{server.url}/compare?run=run-a&run=run-b")  # a shared deep link, query included
        password = page.get_by_label("Password", exact=True)
        password.wait_for(timeout=PAGE_TIMEOUT_S * 1000)
        assert page.get_by_role("heading", name="Compare runs").count() == 0
        password.fill("open sesame")
        page.get_by_role("button", name="Sign in").click()
        page.get_by_text("Wrong password.").wait_for(timeout=PAGE_TIMEOUT_S * 1000)
        assert page.get_by_role("heading", name="Compare runs").count() == 0
        page.get_by_label("Password", exact=True).fill("open sesame 42")
        page.get_by_role("button", name="Sign in").click()
        page.get_by_role("heading", name="Compare runs").wait_for(timeout=PAGE_TIMEOUT_S * 1000)
        assert page.get_by_label("Password", exact=True).count() == 0
        page.wait_for_url(f"{server.url}/compare?run=run-a&run=run-b", timeout=PAGE_TIMEOUT_S * 1000)
        other = page.context.browser.new_page()  # another visitor: a new session
        other.goto(f"{server.url}/run")
        other.get_by_label("Password", exact=True).wait_for(timeout=PAGE_TIMEOUT_S * 1000)
        assert other.get_by_role("heading", name="Run details").count() == 0
        other.close()
