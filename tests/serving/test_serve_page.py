"""Run details' Serve tab through AppTest: start an endpoint for a run's model (the key shown once, never stored),
list the run's endpoints with their URL and model name, refuse bad input naming the field, and show nothing of a
playground server there. The serve job itself is stood in for at the orchestrator (its real path is tested in
test_serve_real.py): a row, and an endpoint.json whose pid is this live process."""
from __future__ import annotations

import json
import os
import time

import pytest

from db.entities import RunRecord
from db.store import Store
from tests.support.factories import insert_finished_run
from tests.support.apptest import open_page
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.jobs import adoption
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus
from trainer_core.serving import endpoint as endpoint_file
from trainer_core.serving.spec import hash_key

RUN, ENDPOINT, PLAYGROUND = "20260105-100000-aaaaaa", "20260105-100100-bbbbbb", "20260105-100200-cccccc"
KEY = "k3y-<b>shown</b>-once"


def serve_row(job_id: str, purpose: str, status: RunStatus = RunStatus.RUNNING) -> RunRecord:
    spec = {"purpose": purpose, "sources": [{"run_id": RUN, "checkpoint": None, "model": ""}],
            "api_key_hash": hash_key(KEY), "host": "0.0.0.0", "port": 8123}
    return RunRecord(id=job_id, name=f"Endpoint · {job_id[-6:]}", status=status, kind=JobKind.SERVE,
                     parent_run_id=RUN, created_at=time.time(), config_json=json.dumps(spec), owner="",
                     pid=os.getpid(), pid_started_at=adoption.started_at(os.getpid()), phase="serving")


@pytest.fixture
def served(app_home):
    store = Store()
    insert_finished_run(store, RUN, "tone", [2.0, 1.5])
    folder = paths.run_dir(RUN)
    (folder / "adapter").mkdir(parents=True)
    (folder / "config.yaml").write_text(TrainConfig(run_name="tone", model_name=BUNDLED_MODEL).to_yaml())
    (folder / "adapter" / "adapter_config.json").write_text("{}")
    for job_id, purpose in ((ENDPOINT, "endpoint"), (PLAYGROUND, "playground")):
        store.create_run(serve_row(job_id, purpose))
        paths.run_dir(job_id).mkdir(parents=True)
        endpoint_file.write(paths.run_dir(job_id), "http://127.0.0.1:8123/v1",
                            [{"name": "tone", "label": "tone · final", "source_key": f"run:{RUN}"}], "transformers",
                            os.getpid(), share_url="http://gpu-box.lan:8123/v1")
    yield store
    store.engine.dispose()


def test_the_runs_endpoints_show_url_and_model_but_never_a_playground_server(served):
    at = open_page("pages/run.py", detail_run_id=RUN)
    assert not at.exception
    assert "Serve" in [t.label for t in at.tabs] and "Serve" in [s.value for s in at.subheader]
    shown = " ".join(m.value for m in at.markdown)
    assert "`http://gpu-box.lan:8123/v1`" in shown and "`tone`" in shown
    assert f"Endpoint · {ENDPOINT[-6:]}" in shown and f"Endpoint · {PLAYGROUND[-6:]}" not in shown
    assert [b.label for b in at.button if b.key == f"serve_stop_{ENDPOINT}"] == ["Stop endpoint"]
    assert KEY not in shown + " ".join(c.value for c in at.code)  # a key is shown only right after its start


def test_starting_an_endpoint_shows_its_key_once(served, monkeypatch):
    started = []

    def start_server(orch, sources, actor=None, purpose="playground", host="127.0.0.1", port=0,
                     idle_timeout_s=1800, **kwargs):
        started.append(([s.key for s in sources], purpose, host, port, idle_timeout_s))
        served.create_run(serve_row("20260105-100300-dddddd", "endpoint", RunStatus.QUEUED))
        return "20260105-100300-dddddd", KEY

    monkeypatch.setattr(Orchestrator, "start_server", start_server)
    at = open_page("pages/run.py", detail_run_id=RUN)
    at.selectbox(key=f"serve_host_{RUN}").set_value("0.0.0.0")
    at.number_input(key=f"serve_port_{RUN}").set_value(8200)
    at.button(key=f"serve_start_{RUN}").click().run()
    assert not at.exception
    assert started == [([f"run:{RUN}"], "endpoint", "0.0.0.0", 8200, 1800)]
    assert KEY in [c.value for c in at.code]  # as plain code: the markup in it is not rendered
    assert any("Waiting for its device" in c.value for c in at.caption)

    at.button(key="serve_key_done_20260105-100300-dddddd").click().run()
    assert KEY not in [c.value for c in at.code]


def test_a_bad_port_is_refused_with_the_field_named_and_nothing_recorded(served):
    at = open_page("pages/run.py", detail_run_id=RUN)
    at.number_input(key=f"serve_port_{RUN}").set_value(80)
    at.button(key=f"serve_start_{RUN}").click().run()
    assert not at.exception
    assert [e.value for e in at.error if e.value.startswith("port")], [e.value for e in at.error]
    assert {r.id for r in served.children(RUN)} == {ENDPOINT, PLAYGROUND}


def test_a_serve_jobs_own_page_shows_where_it_listens(served):
    at = open_page("pages/run.py", detail_run_id=ENDPOINT)
    assert not at.exception
    assert "Endpoint" in [t.label for t in at.tabs]
    assert any("`http://gpu-box.lan:8123/v1`" in m.value for m in at.markdown)


def test_a_network_bind_without_tls_is_warned_about_and_the_limits_reach_the_job(served, monkeypatch):
    started = []

    def start_server(orch, sources, **kwargs):
        started.append(kwargs)
        served.create_run(serve_row("20260105-100300-dddddd", "endpoint", RunStatus.QUEUED))
        return "20260105-100300-dddddd", KEY

    monkeypatch.setattr(Orchestrator, "start_server", start_server)
    at = open_page("pages/run.py", detail_run_id=RUN)
    assert not [w for w in at.warning if "plain HTTP" in w.value]  # 127.0.0.1: only this machine
    at.selectbox(key=f"serve_host_{RUN}").set_value("0.0.0.0").run()
    [warning] = [w.value for w in at.warning if "plain HTTP" in w.value]
    assert "is reachable from the network and the server speaks plain HTTP" in warning  # (markdown-escaped)
    assert "HTTPS proxy" in warning and "shared URL (make share)" in warning
    at.text_input(key=f"serve_cert_{RUN}").set_value("cert.pem")
    at.text_input(key=f"serve_tls_key_{RUN}").set_value("key.pem").run()
    assert not [w for w in at.warning if "plain HTTP" in w.value]
    at.number_input(key=f"serve_cap_{RUN}").set_value(512)
    at.number_input(key=f"serve_timeout_{RUN}").set_value(60)
    at.checkbox(key=f"serve_store_{RUN}").check()  # issue 34: the opt-in to keep completions for ratings
    at.button(key=f"serve_start_{RUN}").click().run()
    assert not at.exception
    [kwargs] = started
    assert (kwargs["max_tokens_cap"], kwargs["request_timeout_s"], kwargs["store_completions"]) == (512, 60, True)
    assert (kwargs["tls_certfile"], kwargs["tls_keyfile"]) == ("cert.pem", "key.pem")


def test_a_tls_file_outside_the_allowed_roots_is_refused_naming_the_field(served):
    at = open_page("pages/run.py", detail_run_id=RUN)
    at.text_input(key=f"serve_cert_{RUN}").set_value("/etc/hostname")
    at.button(key=f"serve_start_{RUN}").click().run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert any(e.startswith("tls_certfile: /etc/hostname resolves to") for e in errors), errors
    assert "tls_keyfile: tls_certfile is set: give both the certificate and its private key" in errors
    assert {r.id for r in served.children(RUN)} == {ENDPOINT, PLAYGROUND}
