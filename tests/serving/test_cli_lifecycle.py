"""Issue 24, wrong states 2: a serve job lives only as long as the `serve`/`chat` command that asked for it.
Ctrl-C, SIGTERM and SIGHUP while it starts or serves end it; a job whose CLI is gone (SIGKILL) ends by itself,
queued or serving; and `stop JOB` / `cancel JOB` do what the pages' buttons do. The serve worker is stood in
for by scripts (tests/support.FakeLauncher)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import psutil
import pytest

from db.store import Store
from tests.serving.test_serve_job import SCRIPTED_WORKER, fake_run
from tests.support import FakeLauncher, wait_until
from trainer_core import __main__ as cli
from trainer_core.config import BUNDLED_MODEL
from trainer_core.jobs import orchestrator as orchestrator_module
from trainer_core.specs.model_source import ModelSource
from trainer_core.specs.jobspec import read_spec
from trainer_core.protocol import control, events as ev, paths
from trainer_core.protocol.status import JobKind, RunStatus
from trainer_core.serving.spec import ServeSpec, consumer_gone, consumer_token, hash_key
from trainer_core.worker.serve import Cancelled, ServeWorker

RUN = "20260101-000000-aaaaaa"
NEVER_READY = """
import sys, time
from pathlib import Path
from trainer_core.protocol import control, events as ev
run_dir = Path(sys.argv[1])
w = ev.EventWriter(run_dir / "events.jsonl")
w.emit(ev.StatusEvent(status="starting", phase="loading the models"))
while control.read(run_dir) is None:
    time.sleep(0.05)
w.emit(ev.CompleteEvent(status="cancelled"))
w.close()
"""


@pytest.fixture
def cli_env(home, monkeypatch):
    """The CLI's own database with a trained run; its orchestrators launch ``worker`` scripts. Signal handlers
    are put back afterwards whatever the command did."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    store = Store()
    fake_run(store, RUN, "done")
    launchers = []

    def use(worker: str) -> None:
        launcher = FakeLauncher(worker)
        launchers.append(launcher)

        class Scripted(orchestrator_module.Orchestrator):
            def __init__(self, **kwargs):
                super().__init__(launcher=launcher, **kwargs)

        monkeypatch.setattr(orchestrator_module, "Orchestrator", Scripted)

    yield store, use
    for launcher in launchers:
        launcher.kill_all()
    store.engine.dispose()
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def serve_jobs(store) -> list:
    return [r for r in store.list_runs() if r.kind is JobKind.SERVE]


def signal_when(condition, sig: int) -> threading.Thread:
    """Send ``sig`` to this process (its main thread runs the CLI) once ``condition()`` holds."""
    def run() -> None:
        try:
            # patient: on a loaded machine a sandboxed worker takes a while to say it is loading, and a thread that
            # gave up would leave the command waiting for a server that never comes (the test then hung 900 s)
            wait_until(condition, timeout=300, what="the moment to signal")
        finally:
            os.kill(os.getpid(), sig)  # even when the moment never came: the command ends, the asserts say why

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("command", [["serve", RUN], ["chat", RUN, "--prompt", "hi"]])
def test_a_signal_while_the_server_starts_ends_its_job(cli_env, capsys, sig, command):
    store, use = cli_env
    use(NEVER_READY)
    watcher = Store()
    thread = signal_when(lambda: any(r.status is RunStatus.STARTING and r.phase == "loading the models"
                                     for r in serve_jobs(watcher)), sig)
    assert cli.main(command) == 3
    thread.join()
    assert "interrupted" in capsys.readouterr().err
    [job] = serve_jobs(store)
    assert store.get_run(job.id).status is RunStatus.CANCELLED  # not left to start later with a key nobody has
    assert read_spec(paths.run_dir(job.id)).consumer == consumer_token()
    watcher.engine.dispose()


def serving() -> bool:
    """The `serve` command printed its key and now waits for the end (its stop handler is in place)."""
    return getattr(signal.getsignal(signal.SIGTERM), "__name__", "") == "on_sigint"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_sigterm_and_sighup_stop_a_serving_server_as_ctrl_c_does(cli_env, capsys, sig):
    store, use = cli_env
    use(SCRIPTED_WORKER)
    watcher = Store()
    thread = signal_when(serving, sig)
    assert cli.main(["serve", RUN]) == 0
    thread.join()
    captured = capsys.readouterr()
    assert "API key: " in captured.out and "stopping the server" in captured.err
    [job] = serve_jobs(store)
    assert store.get_run(job.id).status is RunStatus.STOPPED
    assert signal.getsignal(signal.SIGTERM) is not None
    watcher.engine.dispose()


def test_serve_warns_about_plain_http_off_loopback_and_passes_its_limits(cli_env, capsys):
    store, use = cli_env
    use(SCRIPTED_WORKER)
    watcher = Store()
    thread = signal_when(serving, signal.SIGTERM)
    assert cli.main(["serve", RUN, "--host", "0.0.0.0", "--max-tokens-cap", "512", "--request-timeout", "60"]) == 0
    thread.join()
    err = capsys.readouterr().err
    assert "warning: 0.0.0.0 is reachable from the network and the server speaks plain HTTP" in err
    spec = read_spec(paths.run_dir(serve_jobs(store)[0].id))
    assert (spec.max_tokens_cap, spec.request_timeout_s, spec.tls_certfile) == (512, 60, "")
    watcher.engine.dispose()


def test_serve_with_tls_needs_both_files(cli_env, capsys):
    store, use = cli_env
    use(SCRIPTED_WORKER)
    cert = paths.data_root() / "cert.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    assert cli.main(["serve", RUN, "--host", "0.0.0.0", "--tls-cert", str(cert)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: tls_keyfile: tls_certfile is set: give both the certificate and its private key")
    assert "plain HTTP" not in err and serve_jobs(store) == []


# ---------------------------------------------------------------- the job's consumer is gone
def dead_consumer() -> str:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    token = consumer_token().rsplit(":", 2)[0] + f":{child.pid}:{psutil.Process(child.pid).create_time():.2f}"
    child.wait()
    return token


def test_a_serving_job_whose_cli_is_gone_ends(tmp_path):
    token = dead_consumer()
    assert consumer_gone(token) == f"the process that asked for it (pid {token.split(':')[-2]}) has exited"
    assert consumer_gone(consumer_token()) == ""
    worker = ServeWorker(tmp_path)
    stopped = []
    worker.watch(ServeSpec(idle_timeout_s=0, consumer=token), lambda: 0.0, lambda: stopped.append(True))
    assert stopped == [True]
    status, reason = worker.end_reason
    assert status is RunStatus.CANCELLED and reason.endswith("has exited: nobody else has its key")
    worker.events.close()
    kinds = [type(e).__name__ for e in ev.read_new(tmp_path / "events.jsonl", 0)[0]]
    assert kinds == ["WarningEvent", "StatusEvent"]


def test_a_queued_job_whose_cli_is_gone_is_cancelled_when_its_turn_comes(tmp_path):
    worker = ServeWorker(tmp_path)
    with pytest.raises(Cancelled):
        worker.check_cancel(ServeSpec(consumer=dead_consumer()))
    worker.check_cancel(ServeSpec(consumer=consumer_token()))  # alive: goes on
    worker.check_cancel(ServeSpec())  # a dashboard endpoint has no consumer: teammates hold its key
    worker.events.close()
    [warning] = ev.read_new(tmp_path / "events.jsonl", 0)[0]
    assert warning.message.startswith("Not serving: the process that asked for it")


def test_playground_and_cli_servers_are_tied_to_their_process_and_endpoints_are_not(home, store):
    orch = orchestrator_module.Orchestrator(store=store, launcher=FakeLauncher(NEVER_READY))
    try:
        base = [ModelSource(model=BUNDLED_MODEL)]
        playground, _ = orch.start_server(base)
        endpoint, _ = orch.start_server(base, purpose="endpoint", host="0.0.0.0")
        tied, _ = orch.start_server(base, purpose="endpoint", tied=True)
        consumers = [read_spec(paths.run_dir(j)).consumer for j in (playground, endpoint, tied)]
        assert consumers == [consumer_token(), "", consumer_token()]
        for job in (playground, endpoint, tied):
            orch.cancel(job)
            orch.wait(job, timeout=60)
    finally:
        orch.close()
        orch.launcher.kill_all()


# ---------------------------------------------------------------- stop JOB / cancel JOB
@pytest.mark.parametrize("action,expected", [("stop", RunStatus.STOPPED), ("cancel", RunStatus.STOPPED)])
def test_stop_and_cancel_commands_end_a_running_job(home, capsys, action, expected):
    store = Store()  # the CLI's database: the data root's
    launcher = FakeLauncher(SCRIPTED_WORKER)
    orch = orchestrator_module.Orchestrator(store=store, launcher=launcher)
    try:
        job_id, _ = orch.start_server([ModelSource(model=BUNDLED_MODEL)], purpose="endpoint")
        wait_until(lambda: store.get_run(job_id).status is RunStatus.RUNNING, what="running")
        assert cli.main([action, job_id[:22], "--wait"]) == 0
        captured = capsys.readouterr()
        assert f"{action} requested: " in captured.err
        assert store.get_run(job_id).status is expected  # the scripted worker reports "stopped" either way
        assert captured.out.strip().endswith(f"({job_id}) {expected.label.lower()}")
        assert control.read(paths.run_dir(job_id)) is (control.Action.STOP if action == "stop"
                                                        else control.Action.CANCEL)
        assert cli.main([action, job_id]) == 0
        assert f"has already ended ({expected.label.lower()}): nothing to {action}" in capsys.readouterr().err
    finally:
        orch.close()
        launcher.kill_all()
        store.engine.dispose()


def test_stop_names_an_unknown_job(home, capsys):
    assert cli.main(["cancel", "nope"]) == 2
    assert capsys.readouterr().err.startswith("error: no run matches 'nope'")


def test_spec_consumer_must_be_a_process_token(home):
    errors = ServeSpec(sources=[ModelSource(model=BUNDLED_MODEL)], api_key_hash=hash_key("k"),
                       consumer="nobody").validate()
    assert [e.field for e in errors] == ["consumer"]
