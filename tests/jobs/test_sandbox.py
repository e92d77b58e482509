"""Workers run in the bubblewrap sandbox (trainer_core/protocol/sandbox.py): code a job runs cannot read the server's
environment, the database, the checkout's secrets or another run's folder, cannot write outside its own folder,
has no network when its job needs none, and leaves no process behind. Each probe is also run unsandboxed, where it
succeeds: the test would fail if the sandbox let it through."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid

import psutil
import pytest

from tests.support import FakeLauncher, wait_until
from trainer_core.config import TrainConfig
from trainer_core.config.limits import BUNDLED_MODEL
from trainer_core.protocol import paths, sandbox

pytestmark = pytest.mark.skipif(bool(sandbox.unavailable()), reason=f"no sandbox here: {sandbox.unavailable()}")

PROBE = r'''
import json, os, socket, subprocess, sys
run_dir = sys.argv[1]
tried = {}
def attempt(name, action):
    try:
        tried[name] = str(action())[:100000]
    except Exception as exc:
        tried[name] = None
attempt("server_environ", lambda: open(f"/proc/{os.environ['FAKE_SERVER_PID']}/environ", "rb").read())
attempt("database", lambda: open(os.environ["FAKE_DATABASE"], "rb").read())
attempt("other_run", lambda: open(os.environ["FAKE_OTHER_SECRETS"]).read())
attempt("streamlit_secrets", lambda: open(os.environ["FAKE_STREAMLIT_SECRETS"]).read())
attempt("write_data_root", lambda: open(os.path.join(os.environ["FINETUNE_STUDIO_HOME"], "planted"), "w").write("x"))
attempt("network", lambda: socket.create_connection(("127.0.0.1", int(os.environ["FAKE_PORT"])), timeout=5).close() or "connected")
attempt("own_folder", lambda: open(os.path.join(run_dir, "mine.txt"), "w").write("ok"))
subprocess.Popen(["sleep", os.environ["FAKE_ORPHAN"]], start_new_session=True)  # a reward's leftover process
with open(os.path.join(run_dir, "report.json"), "w") as fh:
    json.dump(tried, fh)
'''


@pytest.fixture
def setting(home, tmp_path, monkeypatch):
    """A server's secrets and files around a worker: a session key in a server process's environment, a database, another
    run's secrets file, a .streamlit/secrets.toml in the working directory, and a listening port on loopback."""
    server = subprocess.Popen(["sleep", "600"], env={**os.environ, "FINETUNE_STUDIO_SESSION_KEY": "session-key-of-the-server"})
    database = paths.data_root() / "studio.db"
    database.write_text("users and tokens")
    other = paths.run_dir("20260101-000000-other0")
    other.mkdir(parents=True)
    (other / ".secrets.json").write_text('{"HF_TOKEN": "hf_other"}')
    cwd = tmp_path / "checkout"
    (cwd / ".streamlit").mkdir(parents=True)
    (cwd / ".streamlit" / "secrets.toml").write_text('studio_password = "pw"')
    monkeypatch.chdir(cwd)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    orphan = str(1000 + uuid.uuid4().int % 9000)  # a sleep length that names this test's leftover process
    for name, value in (("FAKE_SERVER_PID", str(server.pid)), ("FAKE_DATABASE", str(database)),
                        ("FAKE_OTHER_SECRETS", str(other / ".secrets.json")),
                        ("FAKE_STREAMLIT_SECRETS", str(cwd / ".streamlit" / "secrets.toml")),
                        ("FAKE_PORT", str(listener.getsockname()[1])), ("FAKE_ORPHAN", orphan)):
        monkeypatch.setenv(name, value)
    yield orphan
    listener.close()
    server.kill()
    server.wait()


def probe(run_id: str) -> dict:
    launcher = FakeLauncher(worker=PROBE)
    run_dir = paths.run_dir(run_id)
    run_dir.mkdir(parents=True)
    try:
        proc = launcher.spawn(run_dir, TrainConfig(model_name=BUNDLED_MODEL))
        assert proc.wait(timeout=120) == 0, (run_dir / "worker.log").read_text()[-2000:]
    finally:
        launcher.kill_all()
    return json.loads((run_dir / "report.json").read_text())


def leftovers(orphan: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[:2] == ["sleep", orphan]]


def test_a_sandboxed_worker_reaches_nothing_of_the_server(setting):
    report = probe("20260101-000000-sandbx")
    written = report.pop("write_data_root")  # into an empty scratch folder where the data root would be, at most
    assert report == {"server_environ": None, "database": None, "other_run": None, "streamlit_secrets": None,
                      "network": None, "own_folder": "2"}
    assert written in (None, "1") and not (paths.data_root() / "planted").exists()
    assert not leftovers(setting), "a process the job started outlived it"


def test_the_same_worker_unsandboxed_reaches_all_of_it(setting, monkeypatch):
    monkeypatch.setenv(sandbox.SANDBOX_ENV, "off")
    report = probe("20260101-000000-opened")
    try:
        assert "session-key-of-the-server" in report["server_environ"]
        assert report["database"] == "b'users and tokens'" and "hf_other" in report["other_run"]
        assert "studio_password" in report["streamlit_secrets"]
        assert report["write_data_root"] == "1" and report["network"] == "connected"
        assert sandbox.UNSANDBOXED_WARNING in (paths.run_dir("20260101-000000-opened") / "worker.log").read_text()
        wait_until(lambda: leftovers(setting), timeout=30, what="the unsandboxed job's leftover process")
    finally:
        for proc in leftovers(setting):
            proc.kill()


def test_shared_mode_never_runs_a_job_outside_the_sandbox(home, monkeypatch):
    monkeypatch.setenv(sandbox.SHARED_ENV, "1")
    monkeypatch.setenv(sandbox.SANDBOX_ENV, "off")
    assert sandbox.enabled()  # 'off' is for single-user hosts only
    monkeypatch.setattr(sandbox, "unavailable", lambda: "bubblewrap is not installed (apt-get install bubblewrap)")
    with pytest.raises(sandbox.SandboxError, match="shared mode runs no job outside it"):
        sandbox.enabled()
    monkeypatch.delenv(sandbox.SHARED_ENV)
    monkeypatch.delenv(sandbox.SANDBOX_ENV)
    with pytest.raises(sandbox.SandboxError, match="FINETUNE_STUDIO_SANDBOX=off"):
        sandbox.enabled()


def test_a_job_that_names_a_hub_model_or_a_judge_gets_the_network(home, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    readable, runs, network = sandbox.job_inputs({"model_name": str(model), "local_datasets": []})
    assert readable == [model.resolve()] and runs == [] and network is False
    assert sandbox.job_inputs({"model_name": "org/some-model"})[2] is True
    assert sandbox.job_inputs({"model_name": BUNDLED_MODEL, "judge_url": "http://127.0.0.1:9/v1"})[2] is True
    assert sandbox.job_inputs({"model_name": BUNDLED_MODEL, "judge_url": ""})[2] is False
    assert sandbox.job_inputs({"model_name": BUNDLED_MODEL, "enable_wandb": True})[2] is True


def test_bubblewrap_exit_codes_read_as_the_signal_that_killed_the_command(home):
    assert sandbox.exit_reason(137) == -9 and sandbox.exit_reason(143) == -15
    assert sandbox.exit_reason(0) == 0 and sandbox.exit_reason(2) == 2
    done = subprocess.run(sandbox.wrap(["sh", "-c", "kill -9 $$"], env=dict(os.environ)), capture_output=True)
    assert sandbox.exit_reason(done.returncode) == -9


def test_a_path_in_any_field_never_shows_the_database_secrets_or_the_data_root(home, tmp_path):
    root = paths.data_root()
    (root / "studio.db").write_text("x")
    other = paths.run_dir("20260101-000000-other1")
    other.mkdir(parents=True)
    (other / "events.jsonl").write_text("")
    (other / ".secrets.json").write_text("{}")
    (tmp_path / ".streamlit").mkdir()
    (tmp_path / ".streamlit" / "secrets.toml").write_text("x")
    (root / "elsewhere").mkdir()
    named = {"system_prompt": str(root / "studio.db"), "run_name": str(tmp_path / ".streamlit" / "secrets.toml"),
             "data": str(root), "note": str(other / ".secrets.json"), "x": str(root / "elsewhere")}
    readable, runs, _ = sandbox.job_inputs(named)
    assert readable == [] and runs == []
    readable, runs, _ = sandbox.job_inputs({"source": {"run_id": other.name}})
    assert readable == [] and runs == [other]
    command = sandbox.wrap(["true"], readable=runs, env=dict(os.environ))
    at = command.index(str(other / ".secrets.json"))  # the run is shown, its staged secrets file is an empty one
    assert command[at - 2:at + 1] == ["--ro-bind", "/dev/null", str(other / ".secrets.json")]


def test_a_serve_job_may_write_only_its_source_runs_merge_cache(home):
    from trainer_core.specs.model_source import ModelSource
    from trainer_core.jobs.launcher import WorkerLauncher
    from trainer_core.serving.spec import ServeSpec

    source, other = paths.run_dir("20260101-000000-source"), paths.run_dir("20260101-000000-unread")
    own = paths.run_dir("20260101-000000-server")
    for folder in (source, other, own):
        folder.mkdir(parents=True)
    command = WorkerLauncher().sandboxed(["true"], own, ServeSpec(sources=[ModelSource(run_id=source.name)]),
                                         dict(os.environ))
    binds = [(command[i], command[i + 1]) for i, arg in enumerate(command) if arg in ("--bind", "--ro-bind")]
    assert ("--ro-bind", str(source)) in binds and ("--bind", str(source / "serving")) in binds
    assert ("--bind", str(own)) in binds and not any(str(other) in path for _, path in binds)
    assert "--unshare-net" not in command  # a server listens
