"""The Ray launcher against a real local Ray cluster of two nodes (a head and a second ``ray start --address``
node, one CPU each), started and stopped by this module: runs go through the CLI and the orchestrator as Ray
jobs (no secret in what Ray stores; a run's own token reaches its ranks through the run folder), a two-worker run through Ray Train's TorchTrainer (gloo on CPU) with one
rank per node, Stop & save after a dashboard restart re-adopted the job, Ray's own account of a stopped job,
and a lost node failing the run with the rank and node named. Skips without ray."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from db.store import Store
from tests.support.ray_cluster import local_cluster
from tests.support import MODELS_CACHE, ROOT, wait_until
from trainer_core.host import hardware
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.launchers import JobState
from trainer_core.launchers import ray as ray_jobs
from trainer_core.launchers import ray_record
from trainer_core.protocol import paths, secret_file
from trainer_core.protocol.status import RunStatus
from trainer_core.worker.ray_entry import PLACEMENT_FILE

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
from ray.job_submission import JobSubmissionClient  # noqa: E402 - after the skip
from ray.util.state import list_nodes  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.train]

SERVER_SECRET = "hf_server_secret_never_in_ray"  # in the dashboard's environment: must not reach Ray
RUN_SECRET = "hf_run_secret_through_the_run_folder"  # a run's own token: reaches its workers, never Ray's job table


@pytest.fixture(scope="module")
def ray_cluster():
    """A two-node local cluster (tests/support/ray_cluster.py), for this module."""
    with local_cluster() as running:
        yield running


@pytest.fixture
def cluster(ray_cluster) -> str:
    """Its dashboard (Ray Jobs) address."""
    return ray_cluster.address


@pytest.fixture
def studio(cluster, tmp_path, monkeypatch):
    """An orchestrator whose data root is on the cluster's "shared storage" (this machine's tmp_path), with
    RAY_ADDRESS and a hub token in the server's environment."""
    monkeypatch.setenv("FINETUNE_STUDIO_SHARED_STORAGE", str(tmp_path))
    monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FINETUNE_STUDIO_MODELS", str(MODELS_CACHE))
    monkeypatch.setenv("FINETUNE_STUDIO_FORCE_CPU", "1")
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp_path}:{ROOT / '.test-cache'}")
    monkeypatch.setenv("RAY_ADDRESS", cluster)
    monkeypatch.setenv("HF_TOKEN", SERVER_SECRET)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    hardware.cuda_available.cache_clear()
    orch = Orchestrator()
    yield orch
    orch.close()
    for run in orch.store.active_runs():  # a test that failed half-way: leave no job on the cluster
        ray_jobs.RayLauncher(cluster).adopt(run).kill()


def on_ray(tiny_model, **values) -> TrainConfig:
    base = dict(model_name=str(tiny_model), launcher="ray", max_steps=3, batch_size=2, max_seq_length=128,
                logging_steps=1, warmup_steps=0)
    return TrainConfig(**{**base, **values})


def job_of(cluster: str, run_id: str):
    return JobSubmissionClient(cluster).get_job_info(ray_jobs.submission_id(run_id))


def wait_for_step(orch: Orchestrator, run_id: str, step: int) -> None:
    def reached() -> bool:
        snap = orch.snapshot(run_id)
        assert not snap.status.is_terminal(), f"run ended early: {snap.status} {snap.error}\n{orch.log_tail(run_id)}"
        return snap.step >= step
    wait_until(reached, timeout=240, what=f"step {step}")


def test_the_cli_trains_the_bundled_model_as_a_ray_job(cluster, tmp_path):
    config = tmp_path / "on-ray.yaml"
    config.write_text(yaml.safe_dump({"launcher": "ray", "model_name": BUNDLED_MODEL, "max_steps": 3,
                                      "batch_size": 1, "max_seq_length": 64, "logging_steps": 1, "warmup_steps": 0}))
    home = tmp_path / "home"
    env = {"FINETUNE_STUDIO_HOME": str(home), "FINETUNE_STUDIO_SHARED_STORAGE": str(tmp_path), "RAY_ADDRESS": cluster,
           "FINETUNE_STUDIO_FORCE_CPU": "1", "FINETUNE_STUDIO_MODELS": str(MODELS_CACHE), "OMP_NUM_THREADS": "1",
           "FINETUNE_STUDIO_ALLOWED_ROOTS": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
           "FINETUNE_STUDIO_PASSWORD": SERVER_SECRET,  # the dashboard's own secret: never for a worker
           "HF_TOKEN": SERVER_SECRET}  # the CLI's token: not copied into a Ray run (which would refuse it)
    result = subprocess.run([sys.executable, "-m", "trainer_core", "run", "--config", str(config)],
                            capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "final status: completed" in result.stdout
    run_dir = next((home / "runs").iterdir())
    store = Store(f"sqlite:///{home / 'studio.db'}")
    assert list(store.metrics_frame(run_dir.name).dropna(subset=["loss"])["step"]) == [1, 2, 3]
    assert json.loads((run_dir / ray_jobs.JOB_FILE).read_text()) == {
        "address": cluster, "job_id": ray_jobs.submission_id(run_dir.name)}
    job = job_of(cluster, run_dir.name)
    assert job.status == "SUCCEEDED" and job.metadata == {"finetune_studio_run": run_dir.name}
    assert job.entrypoint.endswith(f"-m trainer_core.worker.ray_entry {run_dir}")
    assert SERVER_SECRET not in json.dumps([job.entrypoint, job.metadata, job.runtime_env])


def test_two_workers_train_one_run_with_one_rank_on_each_node(studio, cluster, tiny_model):
    run_id = studio.start(on_ray(tiny_model, num_processes=2, hf_token=RUN_SECRET))
    snap = studio.wait(run_id, timeout=300)
    assert snap.status is RunStatus.COMPLETED, (snap.error, studio.log_tail(run_id))
    # the run's token reached both ranks through the run folder, and neither Ray's job table nor the folder keeps it
    taken = "Secrets HF_TOKEN taken from the run folder (never from Ray's job table)\n"
    assert taken in studio.log_text(run_id)
    assert taken in (paths.run_dir(run_id) / "ranks" / "ray-rank-1.log").read_text()
    job = job_of(cluster, run_id)
    assert RUN_SECRET not in json.dumps([job.entrypoint, job.metadata, job.runtime_env])
    assert not (paths.run_dir(run_id) / secret_file.FILE).exists()
    assert list(studio.metrics(run_id).dropna(subset=["loss"])["step"]) == [1, 2, 3]  # rank 0 alone reports
    placement = json.loads((paths.run_dir(run_id) / PLACEMENT_FILE).read_text())
    assert [p["rank"] for p in placement] == [0, 1]
    nodes = {n.node_id for n in list_nodes(address=cluster)}
    assert len({p["node_id"] for p in placement}) == 2 and {p["node_id"] for p in placement} == nodes
    log = studio.log_text(run_id)
    assert all(f"Ray: rank {p['rank']} on node {p['address']} ({p['node_id'][:12]}), GPUs none\n" in log
               for p in placement)
    record = ray_record.read_record(paths.run_dir(run_id))  # what Live and Run details show
    assert [(r.rank, r.node_id) for r in record.ranks] == [(p["rank"], p["node_id"]) for p in placement]
    assert record.dashboard == f"{cluster}/#/jobs/{ray_jobs.submission_id(run_id)}"
    assert job_of(cluster, run_id).status == "SUCCEEDED"


def test_stop_and_save_reaches_a_job_adopted_by_a_restarted_dashboard(studio, cluster, tiny_model):
    run_id = studio.start(on_ray(tiny_model, max_steps=2000))
    wait_for_step(studio, run_id, 1)
    studio.close()  # the dashboard goes away; the Ray job trains on

    restarted = Orchestrator()
    try:
        wait_until(lambda: restarted._is_tracked(run_id), timeout=30, what="adoption by the restarted dashboard")
        restarted.stop(run_id)
        snap = restarted.wait(run_id, timeout=180)
        assert snap.status is RunStatus.STOPPED, (snap.error, restarted.log_tail(run_id))
        saved = [p.name for p in (paths.run_dir(run_id) / "checkpoints").glob("checkpoint-*")]
        assert saved == [f"checkpoint-{snap.step}"]
        wait_until(lambda: job_of(cluster, run_id).status == "SUCCEEDED", timeout=60, what="the Ray job to end")
    finally:
        restarted.close()


def test_a_job_stopped_on_the_cluster_says_so(studio, cluster, tiny_model):
    run_id = studio.start(on_ray(tiny_model, max_steps=2000))
    wait_for_step(studio, run_id, 1)
    job = job_of(cluster, run_id)  # what Ray's dashboard shows anyone: no trace of the server's HF_TOKEN
    assert SERVER_SECRET not in json.dumps([job.entrypoint, job.metadata, job.runtime_env])
    assert "HF_TOKEN" not in job.runtime_env["env_vars"]
    handle = ray_jobs.RayLauncher(cluster).adopt(studio.get_run(run_id))
    assert handle.state() == JobState(True) and handle.pid is None and not handle.started_here
    handle.kill()  # Ray's stop_job: SIGTERM to the worker (which a single worker reads as Cancel), then SIGKILL
    wait_until(lambda: not handle.state().alive, timeout=60, what="Ray to report the job stopped")
    assert handle.state() == JobState(False, "ended on the Ray cluster as STOPPED: Job was intentionally stopped.")
    snap = studio.wait(run_id, timeout=60)
    assert snap.status is RunStatus.CANCELLED, (snap.error, studio.log_tail(run_id))
    unknown = ray_jobs.RayHandle(cluster, "finetune-studio-unknown")  # e.g. a head restarted without its job table
    assert unknown.state() == JobState(False, f"is not known to the Ray cluster at {cluster} (job finetune-studio-unknown)")


def test_the_cluster_check_finds_every_node_sharing_the_storage(studio, cluster, tmp_path):
    assert ray_jobs.check_cluster(cluster) == []
    assert not list(tmp_path.glob(".ray-probe-*"))  # the probe cleans up after itself


def test_losing_a_node_fails_the_run_naming_the_rank_and_its_node(studio, ray_cluster, tiny_model):
    # Last in this module: the cluster keeps only its head afterwards.
    run_id = studio.start(on_ray(tiny_model, num_processes=2, max_steps=2000))
    wait_for_step(studio, run_id, 2)
    second = next(n.node_id for n in list_nodes(address=ray_cluster.address) if not n.is_head_node)
    placement = json.loads((paths.run_dir(run_id) / PLACEMENT_FILE).read_text())
    lost = next(p for p in placement if p["node_id"] == second)
    ray_cluster.lose_node()
    snap = studio.wait(run_id, timeout=180)
    assert snap.status is RunStatus.FAILED
    assert snap.error.startswith(f"Rank {lost['rank']} of 2 on node {lost['address']} ({second[:12]}) was lost: its "
                                 "Ray worker died ("), snap.error
    steps = list(studio.metrics(run_id).dropna(subset=["loss"])["step"])
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 2  # nothing lost or repeated
