"""The Playground in headless Chromium: an answer streams into the page, piece by piece.

The dashboard runs as ``python -m tests.support.playground_app`` (the real app with its serve jobs played by
``FakeServeJob``, see that module); the fake OpenAI server runs here, in the test process, and holds the
answer back after its first pieces until the test has seen them on the page: partial text first, then
the whole answer with its stats. Every wait is for a condition on the page, never for time to pass."""
from __future__ import annotations

import json
import threading

import pytest

from tests.support.browser import PAGE_TIMEOUT_S, chromium, page, served_dashboard, wait_until  # noqa: F401 - fixtures
from tests.support.fake_openai import FakeOpenAI
from trainer_core.config import BUNDLED_MODEL
from trainer_core.specs.model_source import ModelSource

pytestmark = pytest.mark.browser

ANSWER = "Streaming works nicely in the browser today"
FIRST = "Streaming works"  # the pieces sent before the server waits for the test


def main_text(page) -> str:
    """Text of the main area. With a chat input Streamlit lays the page out as a chat (the main area scrolls
    to the bottom), and the main block has this test id instead of ``stMain``."""
    block = page.locator('[data-testid="stMainBlockContainer"]')
    return block.inner_text() if block.count() else ""


@pytest.fixture
def fake_server():
    server = FakeOpenAI({"smollm2": ANSWER})
    server.gate, server.gate_after = threading.Event(), 2
    server.start()
    yield server
    server.stop()


@pytest.fixture
def dashboard(tmp_path, fake_server):
    served = json.dumps({ModelSource(model=BUNDLED_MODEL).key: "smollm2"})
    with served_dashboard(tmp_path, module="tests.support.playground_app", FAKE_OPENAI_URL=fake_server.url,
                          FAKE_OPENAI_KEY=fake_server.api_key, FAKE_OPENAI_SERVED=served) as server:
        yield server


def test_an_answer_streams_into_the_page(page, dashboard, fake_server, tmp_path):  # noqa: F811
    def diagnostics() -> str:
        page.screenshot(path=tmp_path / "failure.png", full_page=True)
        return (f"url: {page.url}\nscreenshot: {tmp_path / 'failure.png'}\n--- page text\n{main_text(page)[-3000:]}"
                f"\n--- server log\n{dashboard.log_tail()}\nrequests: {fake_server.requests}")

    page.goto(f"{dashboard.url}/playground")
    load = page.get_by_role("button", name="Load models")
    load.wait_for()
    load.click()
    box = page.get_by_placeholder("Ask every model…")
    box.wait_for()
    box.fill("Does streaming work?")
    box.press("Enter")

    partial = wait_until(page, lambda: FIRST in main_text(page) and main_text(page), PAGE_TIMEOUT_S,
                         "the first pieces of the answer", diagnostics, poll_ms=100)
    assert "nicely" not in partial  # the rest is still held back by the server: the page shows a partial answer
    assert fake_server.chat_requests()[0]["messages"][-1] == {"role": "user", "content": "Does streaming work?"}

    fake_server.gate.set()
    whole = wait_until(page, lambda: ANSWER in main_text(page) and "first token" in main_text(page)
                       and main_text(page), PAGE_TIMEOUT_S, "the whole answer with its stats", diagnostics)
    assert "7 tokens · first token" in whole

    # Stop: the next answer is held back again, and Stop ends it with the part that came.
    fake_server.gate = threading.Event()
    box.fill("Once more?")
    box.press("Enter")
    wait_until(page, lambda: main_text(page).count(FIRST) == 2, PAGE_TIMEOUT_S, "the second partial answer",
               diagnostics, poll_ms=100)
    # The page's own Stop (the header has one too, for the running script)
    page.locator('[data-testid="stMainBlockContainer"]').get_by_role("button", name="Stop").click()
    stopped = wait_until(page, lambda: "Stopped." in main_text(page) and main_text(page), PAGE_TIMEOUT_S,
                         "the stopped answer", diagnostics)
    second = stopped[stopped.index("Once more?"):]
    assert FIRST in second and "nicely" not in second and "2 tokens · first token" in second, second
