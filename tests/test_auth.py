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

from db.models import Run
from db.store import Store
from tests.test_orchestrator import wait_until
from tests.test_pages import APP, TIMEOUT
from trainer_core import paths
from trainer_core.status import RunStatus
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
    store.create_run(Run(id=run_id, name="left behind", status=RunStatus.RUNNING.value, pid=gone.pid,
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


def test_password_from_streamlit_secrets_wins(monkeypatch):
    monkeypatch.setattr(auth.st, "secrets", {"studio_password": "from-secrets"})
    monkeypatch.setenv(auth.ENV_VAR, "from-env")
    assert auth.configured_password() == "from-secrets"


def test_comparison_is_constant_time_and_exact():
    assert auth.password_matches("s3cret", "s3cret")
    assert not auth.password_matches("s3cre", "s3cret")
    assert not auth.password_matches("", "s3cret")
    assert not auth.password_matches("S3CRET", "s3cret")
    assert "compare_digest" in inspect.getsource(auth.password_matches)
