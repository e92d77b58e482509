"""``launcher: ray`` without a cluster: what validation asks for (naming the field and the fix), what a Ray job's
environment may hold (never a secret: Ray shows it on its dashboard), the shared-storage rule, and how a run
is routed to Ray and found again. The cluster itself: test_ray_cluster.py."""
from __future__ import annotations

import json

import pytest

from trainer_core.config import ConfigError, FieldError, TrainConfig
from trainer_core.jobs import queue
from trainer_core.jobs.launcher import PlacingLauncher, WorkerLauncher, cluster_devices, launcher_problems
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.launchers import ray as ray_jobs
from trainer_core.launchers.local import LocalHandle
from trainer_core.protocol import paths


@pytest.fixture
def shared(home, tmp_path, monkeypatch):
    """The data root on the "shared storage", and a cluster address in the server's environment."""
    monkeypatch.setenv("FINETUNE_STUDIO_SHARED_STORAGE", str(tmp_path))
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    return tmp_path


def ray_errors(cfg: TrainConfig) -> list[FieldError]:
    return [e for e in cfg.validate() if e.field in ("launcher", "ray_address", "ray_gpus_per_worker", "gpu_ids",
                                                     "num_processes", "hf_token", "wandb_token")]


def test_a_ray_run_with_a_cluster_and_shared_storage_validates(shared, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_RAY_ADDRESSES", "http://other:8265")  # another cluster a run may name
    assert ray_errors(TrainConfig(launcher="ray", num_processes=2)) == []
    assert ray_errors(TrainConfig(launcher="ray", ray_address="http://other:8265", ray_gpus_per_worker=1)) == []


def test_every_missing_piece_of_a_ray_run_is_named_with_its_fix(home, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = TrainConfig(launcher="ray", gpu_ids=[0], hf_token="hf_x", ray_gpus_per_worker=-1)  # a token is fine
    assert ray_errors(cfg) == [
        FieldError("ray_address", "launcher: ray needs the cluster's dashboard address: set ray_address (e.g. "
                   "http://head:8265), or RAY_ADDRESS in the server's environment (or save a cluster in Settings)"),
        FieldError("gpu_ids", "Ray places the workers on the cluster's GPUs: leave gpu_ids empty and set "
                   "ray_gpus_per_worker"),
        FieldError("ray_gpus_per_worker", "use 0 (CPU workers) or a positive number of GPUs, got -1"),
    ]
    assert ray_errors(TrainConfig(launcher="slurm")) == [
        FieldError("launcher", "choose local or ray (this host, or a Ray cluster)")]


def test_a_server_without_shared_storage_refuses_ray_runs_before_recording_them(home, store, monkeypatch):
    monkeypatch.delenv("FINETUNE_STUDIO_SHARED_STORAGE", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    cfg = TrainConfig(launcher="ray", ray_address="http://head:8265")
    assert cfg.validate() == []  # the fields are fine: it is this server that lacks the setting
    problem = FieldError("launcher", "launcher: ray: run folders must be on storage every node of the Ray cluster "
                         "mounts: set FINETUNE_STUDIO_SHARED_STORAGE to that path in the server's environment, with "
                         "FINETUNE_STUDIO_HOME under it")
    assert launcher_problems(cfg) == [problem] and launcher_problems(TrainConfig()) == []
    orch = Orchestrator(store=store, start_pump=False)
    try:
        with pytest.raises(ConfigError) as refused:
            orch.start(cfg)
        assert problem in refused.value.errors and store.list_runs() == []
    finally:
        orch.close()


def test_run_folders_outside_the_shared_storage_are_refused_at_validation_and_at_launch(home, tmp_path, monkeypatch):
    elsewhere = tmp_path / "nfs"
    elsewhere.mkdir()
    monkeypatch.setenv("FINETUNE_STUDIO_SHARED_STORAGE", str(elsewhere))
    assert launcher_problems(TrainConfig(launcher="ray")) == [FieldError(
        "launcher", f"launcher: ray: {paths.runs_dir()} is not under the shared storage {elsewhere} "
        "(FINETUNE_STUDIO_SHARED_STORAGE): set FINETUNE_STUDIO_HOME to a folder under it")]
    run_dir = paths.run_dir("r1")
    run_dir.mkdir(parents=True)
    with pytest.raises(OSError, match="is not under the shared storage"):
        ray_jobs.RayLauncher("http://head:8265").start(run_dir, TrainConfig(launcher="ray"))
    assert not (run_dir / ray_jobs.JOB_FILE).exists()  # nothing was submitted


def test_the_job_environment_holds_no_secret_and_no_path_of_this_host(shared, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_server")
    monkeypatch.setenv("WANDB_API_KEY", "wandb_server")
    monkeypatch.setenv("FINETUNE_STUDIO_PASSWORD", "dashboard")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    run_dir = paths.run_dir("r1")
    env = ray_jobs.RayLauncher("http://head:8265").environment(run_dir, 2, 1.0)
    assert not {"hf_server", "wandb_server", "dashboard"} & set(env.values())
    assert not {"HF_TOKEN", "WANDB_API_KEY", "FINETUNE_STUDIO_PASSWORD", "PATH", "HOME", "VIRTUAL_ENV"} & set(env)
    assert (env["OMP_NUM_THREADS"], env["FINETUNE_STUDIO_NPROC"], env[ray_jobs.GPUS_ENV]) == ("3", "2", "1.0")
    assert env["RAY_JOB_STOP_WAIT_TIME_S"] == "30"  # time for a worker's Cancel before Ray's SIGKILL
    assert env["FINETUNE_STUDIO_HOME"] == str(paths.data_root()) and env["PYTHONPATH"] == str(ray_jobs.ROOT)


def test_ray_runs_take_the_cluster_and_never_this_hosts_devices(shared):
    ray_run, local_run = TrainConfig(launcher="ray"), TrainConfig()
    first, second = cluster_devices(ray_run), cluster_devices(ray_run)
    assert cluster_devices(local_run) is None and first != second
    busy = [queue.devices_of(local_run), first]
    assert queue.startable([("a", second), ("b", queue.devices_of(local_run))], busy) == ["a"]


def test_a_run_is_adopted_by_the_launcher_that_started_it(shared):
    ray_dir, local_dir = paths.run_dir("on-ray"), paths.run_dir("here")
    for run_dir in (ray_dir, local_dir):
        run_dir.mkdir(parents=True)
    (ray_dir / ray_jobs.JOB_FILE).write_text(json.dumps({"address": "http://head:8265", "job_id": "finetune-studio-on-ray"}))

    class Run:
        pid, pid_started_at = None, None

        def __init__(self, run_id):
            self.id = run_id

    launcher = PlacingLauncher(WorkerLauncher())
    on_ray = launcher.adopt(Run("on-ray"))
    assert isinstance(on_ray, ray_jobs.RayHandle)
    assert (on_ray.address, on_ray.job_id, on_ray.pid, on_ray.record()) == (
        "http://head:8265", "finetune-studio-on-ray", None, {})
    assert isinstance(launcher.adopt(Run("here")), LocalHandle)


def test_a_cluster_that_stops_answering_ends_the_run_after_a_grace_period(monkeypatch):
    handle = ray_jobs.RayHandle("http://127.0.0.1:9", "finetune-studio-x")  # port 9: nobody listens
    clock = [1000.0]
    monkeypatch.setattr(ray_jobs.time, "monotonic", lambda: clock[0])
    assert handle.state().alive  # a blip: asked again later
    clock[0] += ray_jobs.UNREACHABLE_S + 1
    state = handle.state()
    assert not state.alive and state.reason.startswith(
        "could not be followed: the Ray cluster at http://127.0.0.1:9 has not answered for 60s (")


def test_the_cluster_check_names_what_is_missing_without_raising(home, tmp_path, monkeypatch):
    monkeypatch.delenv("FINETUNE_STUDIO_SHARED_STORAGE", raising=False)
    assert ray_jobs.check_cluster("http://127.0.0.1:9") == [ray_jobs.shared_storage_problem(paths.runs_dir())]
    monkeypatch.setenv("FINETUNE_STUDIO_SHARED_STORAGE", str(tmp_path))
    [problem] = ray_jobs.check_cluster("http://127.0.0.1:9")  # port 9: nobody listens
    assert problem.startswith("the Ray cluster at http://127.0.0.1:9 cannot be used (ConnectionError: ")
    assert not list(tmp_path.glob(".ray-probe-*"))
