"""Secrets of a Ray job (issue 23): a run's HF token and W&B key, a hub push's HF_TOKEN and a judge's key reach
the job through its run folder on the shared storage (protocol/secret_file.py), never through what Ray keeps in
its job table (entrypoint, metadata, runtime_env), which anyone with the cluster's dashboard reads. Without a
cluster: a fake Jobs client records what would reach Ray. The worker's side (taking them, refusing a file that is
not the dashboard's) runs here too; tests/launchers/test_ray_cluster.py follows a run on a real local cluster."""
from __future__ import annotations

import json
import os
import stat
import sys
from types import SimpleNamespace

import pytest

from tests.launchers.test_ray_jobs import RUN_ID, eval_on_ray, export_on_ray, finished_run
from tests.support import ROOT, run_python
from tests.support.ray_cluster import SERVER, shared  # noqa: F401 - shared: the data root on the shared storage
from trainer_core.config import TrainConfig
from trainer_core.jobs.launcher import PlacingLauncher, WorkerLauncher
from trainer_core.launchers import ray as ray_jobs
from trainer_core.protocol import paths, secret_file


class FakeJobs:
    def __init__(self, calls: list, fail: bool = False):
        self.calls, self.fail = calls, fail

    def submit_job(self, **kwargs):
        if self.fail:
            raise ConnectionError("the head is down")
        self.calls.append(kwargs)
        return kwargs["submission_id"]

    def get_job_info(self, job_id: str):
        return SimpleNamespace(status="RUNNING", message="")


@pytest.fixture
def calls(monkeypatch) -> list:
    recorded: list = []
    monkeypatch.setattr(ray_jobs, "job_client", lambda address: FakeJobs(recorded))
    return recorded


def start(run_id: str, cfg) -> tuple[dict, object]:
    run_dir = paths.run_dir(run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    PlacingLauncher(WorkerLauncher()).start(run_dir, cfg)
    return run_dir


def in_run_folder(run_dir) -> dict:
    path = run_dir / secret_file.FILE
    assert stat.S_IMODE(path.lstat().st_mode) == 0o600 and path.is_file() and not path.is_symlink()
    return json.loads(path.read_text())


def test_a_runs_tokens_wait_in_its_run_folder_and_ray_is_told_only_that(shared, calls, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_of_the_server")  # the server's own: a run passes its own, not this one
    cfg = TrainConfig(launcher="ray", num_processes=2, hf_token="hf_run_token", wandb_token="wandb_run_key")
    assert [e for e in cfg.validate() if e.field in ("hf_token", "wandb_token")] == []
    run_dir = start("r1", cfg)
    [submitted] = calls
    stored = json.dumps(submitted)  # entrypoint, metadata, runtime_env: what Ray's dashboard shows anyone
    assert not {"hf_run_token", "wandb_run_key", "hf_of_the_server"} & set(stored.replace('"', " ").split())
    assert "hf_run_token" not in stored and "wandb_run_key" not in stored and "hf_of_the_server" not in stored
    assert submitted["runtime_env"]["env_vars"][secret_file.FLAG_ENV] == "1"
    assert in_run_folder(run_dir) == {"HF_TOKEN": "hf_run_token", "WANDB_API_KEY": "wandb_run_key"}


def test_a_run_without_secrets_leaves_no_file_and_no_flag(shared, calls):
    run_dir = paths.run_dir("r2")
    run_dir.mkdir(parents=True)
    (run_dir / secret_file.FILE).write_text('{"HF_TOKEN": "left from an earlier start"}')
    start("r2", TrainConfig(launcher="ray"))
    assert secret_file.FLAG_ENV not in calls[0]["runtime_env"]["env_vars"]
    assert not (run_dir / secret_file.FILE).exists()


def test_a_submission_the_cluster_refuses_takes_its_secrets_back(shared, monkeypatch):
    monkeypatch.setattr(ray_jobs, "job_client", lambda address: FakeJobs([], fail=True))
    run_dir = paths.run_dir("r3")
    run_dir.mkdir(parents=True)
    with pytest.raises(OSError, match="did not take the job"):
        ray_jobs.RayLauncher(SERVER).start(run_dir, TrainConfig(launcher="ray", hf_token="hf_run_token"))
    assert not (run_dir / secret_file.FILE).exists()


def test_an_export_that_pushes_and_an_eval_with_a_judges_key_run_on_ray_with_their_secrets(shared, calls,
                                                                                         monkeypatch):
    finished_run()
    monkeypatch.setenv("HF_TOKEN", "hf_server_secret")
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_KEY_ENVS", "JUDGE_API_KEY")
    monkeypatch.setenv("JUDGE_API_KEY", "judge_secret")
    export = export_on_ray(push_repo_id="me/model")
    assert export.validate() == []  # once refused: there was no way into a Ray job but its public environment
    judged = eval_on_ray(shared, metrics=["judge"], judge_url="https://judge.example/v1", judge_model="m",
                         judge_key_env="JUDGE_API_KEY")
    assert [e for e in judged.validate() if e.field in ("judge_key_env", "launcher")] == []
    export_dir, eval_dir = start("job-export", export), start("job-eval", judged)
    assert "hf_server_secret" not in json.dumps(calls) and "judge_secret" not in json.dumps(calls)
    assert in_run_folder(export_dir) == {"HF_TOKEN": "hf_server_secret"}
    assert in_run_folder(eval_dir) == {"JUDGE_API_KEY": "judge_secret"}
    assert RUN_ID  # the source run both jobs read


TAKE = """
import json, os, sys
from pathlib import Path
from trainer_core.protocol import secret_file
run_dir, keep = Path(sys.argv[1]), sys.argv[2] == "keep"
env = {"HOME": "/h", "HF_TOKEN": "already set"} if sys.argv[3] == "preset" else {}
if sys.argv[4] == "flag":
    env[secret_file.FLAG_ENV] = "1"
try:
    taken = secret_file.load(run_dir, env, keep=keep)
except secret_file.SecretFileError as exc:
    print(json.dumps({"error": str(exc)}))
else:
    print(json.dumps({"taken": taken, "env": env, "left": (run_dir / secret_file.FILE).exists()}))
"""


def take(run_dir, keep: bool = False, preset: bool = False, flag: bool = True) -> dict:
    result = run_python(TAKE, str(run_dir), "keep" if keep else "once", "preset" if preset else "-",
                        "flag" if flag else "-")
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_worker_takes_them_once_or_keeps_them_for_other_ranks(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    values = {"HF_TOKEN": "hf_x", "WANDB_API_KEY": "wandb_x"}
    secret_file.write(run_dir, values)
    assert take(run_dir, flag=False) == {"taken": [], "env": {}, "left": True}  # a local worker: not its business
    assert take(run_dir, keep=True) == {"taken": ["HF_TOKEN", "WANDB_API_KEY"],
                                        "env": {secret_file.FLAG_ENV: "1", **values}, "left": True}
    # never replacing what the job's environment already holds
    assert take(run_dir, preset=True)["env"]["HF_TOKEN"] == "already set"
    assert not (run_dir / secret_file.FILE).exists()  # a lone worker removed it
    assert take(run_dir) == {"taken": [], "env": {secret_file.FLAG_ENV: "1"}, "left": False}


def test_a_file_that_is_not_the_dashboards_is_refused_and_runtime_variables_are_never_taken(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"HF_TOKEN": "planted"}')
    os.chmod(elsewhere, 0o600)
    os.symlink(elsewhere, run_dir / secret_file.FILE)
    assert "cannot be opened as the run's secrets" in take(run_dir)["error"]
    (run_dir / secret_file.FILE).unlink()
    (run_dir / secret_file.FILE).write_text('{"HF_TOKEN": "planted"}')
    os.chmod(run_dir / secret_file.FILE, 0o644)  # readable by others: not what the dashboard writes
    assert "readable by it alone" in take(run_dir)["error"]
    os.chmod(run_dir / secret_file.FILE, 0o600)
    if os.geteuid() == 0:  # another user's file (root can make one)
        os.chown(run_dir / secret_file.FILE, 12345, 12345)
        assert "owner 12345" in take(run_dir)["error"]
        os.chown(run_dir / secret_file.FILE, 0, 0)
    (run_dir / secret_file.FILE).write_text('{"LD_PRELOAD": "/tmp/x.so", "PYTHONPATH": "/tmp", "HF_TOKEN": "ok", '
                                            '"lower": "x", "RAY_ADDRESS": "http://evil:8265", "N": 3}')
    os.chmod(run_dir / secret_file.FILE, 0o600)
    assert take(run_dir)["taken"] == ["HF_TOKEN"]
    for bad in ("[1, 2]", "not json"):
        (run_dir / secret_file.FILE).write_text(bad)
        os.chmod(run_dir / secret_file.FILE, 0o600)
        assert "is not the JSON the dashboard writes" in take(run_dir)["error"]
    with pytest.raises(ValueError, match="not a secret's variable name"):
        secret_file.write(run_dir, {"LD_PRELOAD": "/tmp/x.so"})


def test_the_worker_entry_takes_them_and_says_so_without_the_values(tmp_path, home):
    run_dir = paths.run_dir("20260101-000000-b2b2b2")
    run_dir.mkdir(parents=True)
    (run_dir / "kind.txt").write_text("nonsense\n")  # the entry stops at the kind: nothing heavy runs
    secret_file.write(run_dir, {"HF_TOKEN": "hf_value_never_logged"})
    env = {**os.environ, secret_file.FLAG_ENV: "1", "PYTHONPATH": str(ROOT)}
    import subprocess
    result = subprocess.run([sys.executable, "-m", "trainer_core.worker", str(run_dir)], capture_output=True,
                            text=True, env=env, cwd=ROOT, timeout=120)
    assert result.returncode == 2, result.stderr  # the unknown kind, named in worker.log
    assert "Secrets HF_TOKEN taken from the run folder (never from Ray's job table)" in result.stderr
    assert "hf_value_never_logged" not in result.stdout + result.stderr
    assert not (run_dir / secret_file.FILE).exists()  # a lone worker: read once, removed
    secret_file.write(run_dir, {"HF_TOKEN": "hf_value_never_logged"})
    os.chmod(run_dir / secret_file.FILE, 0o640)
    result = subprocess.run([sys.executable, "-m", "trainer_core.worker", str(run_dir)], capture_output=True,
                            text=True, env=env, cwd=ROOT, timeout=120)
    assert result.returncode == 2 and "readable by it alone" in result.stderr  # the job stops, saying why


@pytest.mark.parametrize("name", ["judge_key", "PYTHON_JUDGE_KEY", "RAY_JUDGE_KEY"])
def test_a_judge_key_the_run_folder_cannot_carry_is_named_before_start_and_fails_a_start_cleanly(shared, calls,
                                                                                                 monkeypatch, name):
    """An admin may declare any variable for judging (lower case, or one the worker never takes from the file:
    it steers the runtime): on Ray it is refused by validation naming the field, and a start that meets it anyway
    (a queued job.json) fails as a start that could not happen (OSError), submitting nothing and writing nothing."""
    finished_run()
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_KEY_ENVS", name)
    monkeypatch.setenv(name, "judge_secret")
    judged = eval_on_ray(shared, metrics=["judge"], judge_url="https://judge.example/v1", judge_model="m",
                         judge_key_env=name)
    [error] = [e for e in judged.validate() if e.field == "judge_key_env"]
    assert name in error.message and "JUDGE_API_KEY" in error.message and "launcher: local" in error.message
    run_dir = paths.run_dir("job-eval-bad")
    run_dir.mkdir(parents=True)
    with pytest.raises(OSError, match=name):
        PlacingLauncher(WorkerLauncher()).start(run_dir, judged)
    assert calls == [] and not list(run_dir.glob(".secrets*"))


def test_a_staging_file_left_by_a_dashboard_killed_mid_write_goes_with_the_secrets(tmp_path):
    """write() fills a new file under a random name, then renames it into place: a dashboard killed in between left
    the tokens in the run folder for good (removal knew only the final name). Every removal takes such leftovers."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    secret_file.write(run_dir, {"HF_TOKEN": "hf_x"})
    left = run_dir / ".secrets-0123456789abcdef.tmp"
    left.write_text('{"HF_TOKEN": "hf_y"}')
    (run_dir / "notes.tmp").write_text("the user's")
    secret_file.remove(run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == ["notes.tmp"]
    secret_file.remove(tmp_path / "gone")  # a run folder deleted meanwhile: nothing to do


def test_a_fifo_in_place_of_the_file_is_refused_not_waited_on(tmp_path):
    """A named pipe at the file's name (anyone who can write the run folder on the shared storage can make one):
    opening it for reading waited forever for a writer, so the worker hung before it could refuse it."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / secret_file.FILE, 0o600)
    result = run_python(TAKE, str(run_dir), "once", "-", "flag", timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "is not a file of this user readable by it alone" in json.loads(result.stdout.strip())["error"]
