"""The optional password gate in the entry point."""
from __future__ import annotations

import inspect
import subprocess
import sys
import time

import psutil

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from db.entities import RunRecord
from db.store import Store
from tests.support import wait_until
from tests.support.apptest import APP, TIMEOUT
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus
from trainer_core.auth import access
from ui import auth
from ui.state import get_orchestrator


@pytest.fixture
def gated(home, monkeypatch):
    monkeypatch.setenv(auth.ENV_VAR, "correct horse battery")
    st.cache_resource.clear()
    yield
    get_orchestrator().close()
    st.cache_resource.clear()


def test_without_a_password_the_gate_is_off(home, monkeypatch):
    monkeypatch.delenv(auth.ENV_VAR, raising=False)
    st.cache_resource.clear()
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception
    assert not [t for t in at.text_input if t.label == "Password"]
    get_orchestrator().close()
    st.cache_resource.clear()


def test_gate_blocks_every_page(gated):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception
    assert [t.label for t in at.text_input] == ["Password"]
    assert not at.sidebar.markdown  # no shared sidebar (and no run names) before signing in
    for page in ("pages/history.py", "pages/run.py", "pages/live.py", "pages/new_run.py"):
        at.switch_page(page).run()
        assert [t.label for t in at.text_input] == ["Password"], page
        assert [t.value for t in at.title] == ["Finetune Studio"], page


def test_the_orchestrator_starts_with_the_first_request_even_before_anyone_signs_in(gated, home):
    """After a server restart the first request, a sign-in page included, adopts runs left behind and moves
    the queue: a run whose worker died while the server was down is settled without anyone signing in."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(gone.pid).create_time()
    gone.wait()
    run_id = "20260101-000000-0a0a0a"
    paths.run_dir(run_id).mkdir(parents=True)
    store = Store()
    store.create_run(RunRecord(id=run_id, name="left behind", status=RunStatus.RUNNING.value, pid=gone.pid,
                         pid_started_at=started, created_at=time.time()))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert [t.label for t in at.text_input] == ["Password"]  # still at the gate
    wait_until(lambda: store.get_run(run_id).status == RunStatus.FAILED.value, what="the orphan to be settled")
    assert "disappeared" in store.get_run(run_id).error


def test_right_password_opens_the_app_and_a_wrong_one_does_not(gated):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.text_input(key="_studio_password_input").input("wrong")
    at.button[0].click().run()
    assert [e.value for e in at.error] == ["Wrong password."]
    assert [t.label for t in at.text_input] == ["Password"]

    at.text_input(key="_studio_password_input").input("correct horse battery")
    at.button[0].click().run()
    assert not at.exception
    assert "Password" not in [t.label for t in at.text_input]
    at.switch_page("pages/history.py").run()
    assert [t.value for t in at.title] == ["History"]


def test_password_from_the_secrets_file_wins(monkeypatch, tmp_path):
    secrets = tmp_path / "secrets.toml"
    secrets.write_text('studio_password = "from-secrets"\n')
    monkeypatch.setattr(access, "secrets_files", lambda: [tmp_path / "missing.toml", secrets])
    monkeypatch.setenv(auth.ENV_VAR, "from-env")
    assert auth.configured_password() == "from-secrets"


def test_a_malformed_secrets_file_closes_every_page(home, monkeypatch, tmp_path):
    """Streamlit's own st.secrets treated a parse error like a missing file: the password became empty."""
    secrets = tmp_path / "secrets.toml"
    secrets.write_text('studio_password = "no closing quote\n')
    monkeypatch.setattr(access, "secrets_files", lambda: [secrets])
    monkeypatch.delenv(auth.ENV_VAR, raising=False)
    st.cache_resource.clear()
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception
    [error] = [e.value for e in at.error]
    assert f"{secrets} is not valid TOML" in error and "line 1" in error
    assert not at.sidebar.markdown and not at.title  # nothing of the app is drawn
    at.switch_page("pages/history.py").run()
    assert [e.value for e in at.error] == [error] and not at.title
    st.cache_resource.clear()


def test_shared_mode_without_the_proxy_header_draws_nothing(home, monkeypatch):
    monkeypatch.setenv(auth.SHARED_ENV, "1")
    monkeypatch.setenv(auth.ENV_VAR, "irrelevant here")
    st.cache_resource.clear()
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert [e.value for e in at.error] == [
        "This server runs in shared mode and only answers through its sign-in proxy (`make share`); this request "
        "did not come through it."]
    assert not at.title and not at.text_input and not at.sidebar.markdown  # no password form either
    st.cache_resource.clear()


def test_comparison_is_constant_time_and_exact():
    assert auth.password_matches("s3cret", "s3cret")
    assert not auth.password_matches("s3cre", "s3cret")
    assert not auth.password_matches("", "s3cret")
    assert not auth.password_matches("S3CRET", "s3cret")
    assert "compare_digest" in inspect.getsource(auth.password_matches)


def test_wrong_passwords_are_limited_for_the_whole_server(gated, monkeypatch):
    clock = {"now": 1000.0}
    monkeypatch.setattr(auth.time, "monotonic", lambda: clock["now"])
    for attempt in range(auth._Attempts.MAX_FAILURES):
        at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()  # a new session each time
        at.text_input(key="_studio_password_input").input(f"guess {attempt}")
        at.button[0].click().run()
        assert [e.value for e in at.error] == ["Wrong password."]
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.text_input(key="_studio_password_input").input("correct horse battery")  # even the right one waits
    at.button[0].click().run()
    assert [e.value for e in at.error] == ["Too many wrong passwords: try again in 60 s."]
    clock["now"] += auth._Attempts.WINDOW_S + 1
    at.text_input(key="_studio_password_input").input("correct horse battery")
    at.button[0].click().run()
    assert not at.error and "Password" not in [t.label for t in at.text_input]
