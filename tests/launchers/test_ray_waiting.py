"""A Ray run the cluster cannot place yet shows "waiting for the cluster: needs N, M free" on a real local cluster
(tests/support/ray_cluster.py: two nodes of one CPU each): three workers wait for a third CPU until Cancel ends them; a
single worker waits while two other jobs hold both CPUs until Cancel ends it and stops its Ray job; two workers
wait while another job holds a CPU and start by themselves once it ends. The same cluster's nodes give New run's
estimate of CPU workers its memory (their RAM as Ray's dashboard reports it; the GPU path is
tests/launchers/test_ray_worker_memory.py). Skips without ray."""
from __future__ import annotations

import contextlib
import json

import psutil
import pytest

from tests.support.ray_cluster import local_cluster
from tests.support import MODELS_CACHE, ROOT, wait_until
from trainer_core.__main__ import _status_text
from trainer_core.config import TrainConfig
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.launchers import ray as ray_jobs, ray_nodes
from trainer_core.launchers.ray_waiting import PLACED
from trainer_core.planning import memory
from trainer_core.host import hardware
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus
from trainer_core.worker.ray_entry import PLACEMENT_FILE
from ui import format as fmt

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
from ray.job_submission import JobSubmissionClient  # noqa: E402 - after the skip

pytestmark = [pytest.mark.ray, pytest.mark.train]


@pytest.fixture(scope="module")
def cluster():
    """Two nodes of one CPU each (its dashboard's address)."""
    with local_cluster() as running:
        yield running.address


@pytest.fixture
def studio(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_SHARED_STORAGE", str(tmp_path))
    monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FINETUNE_STUDIO_MODELS", str(MODELS_CACHE))
    monkeypatch.setenv("FINETUNE_STUDIO_FORCE_CPU", "1")
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp_path}:{ROOT / '.test-cache'}")
    monkeypatch.setenv("RAY_ADDRESS", cluster)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    hardware.cuda_available.cache_clear()
    orch = Orchestrator()
    yield orch
    orch.close()
    for run in orch.store.active_runs():  # a test that failed half-way: leave no job on the cluster
        ray_jobs.RayLauncher(cluster).adopt(run).kill()


def on_ray(tiny_model, **values) -> TrainConfig:
    base = dict(model_name=str(tiny_model), launcher="ray", max_steps=2, batch_size=2, max_seq_length=64,
                logging_steps=1, warmup_steps=0)
    return TrainConfig(**{**base, **values})


def wait_for_phase(orch: Orchestrator, run_id: str, phase: str) -> None:
    def shown() -> bool:
        snap = orch.snapshot(run_id)
        assert not snap.status.is_terminal(), f"run ended early: {snap.status} {snap.error}\n{orch.log_tail(run_id)}"
        return snap.phase == phase
    wait_until(shown, timeout=120, what=f"the phase {phase!r}")


def job_status(cluster: str, run_id: str) -> str:
    return JobSubmissionClient(cluster).get_job_status(ray_jobs.submission_id(run_id))


def test_three_workers_on_two_cpus_wait_for_the_cluster_until_cancelled(studio, cluster, tiny_model):
    run_id = studio.start(on_ray(tiny_model, num_processes=3))
    waiting = "waiting for the cluster: needs 3 CPUs, 2 free"
    wait_for_phase(studio, run_id, waiting)  # stable: the cluster has no third CPU
    assert studio.snapshot(run_id).status is RunStatus.STARTING
    wait_until(lambda: studio.store.get_run(run_id).phase == waiting, timeout=30, what="the phase in the database")
    run = studio.store.get_run(run_id)
    assert fmt.status_badge(run.status, run.kind, run.phase) == f"🚀 Starting · {waiting}"  # History's status
    assert _status_text(run) == f"Starting ({waiting})"  # the CLI's
    studio.cancel(run_id)
    snap = studio.wait(run_id, timeout=60)
    assert snap.status is RunStatus.CANCELLED, (snap.error, studio.log_tail(run_id))
    wait_until(lambda: job_status(cluster, run_id) not in ("PENDING", "RUNNING"), timeout=30, what="the job's end")
    timeline = [e.message for e in studio.events(run_id) if e.kind == "status"]
    assert f"Starting: {waiting}" in timeline


@contextlib.contextmanager
def cpus_taken(cluster: str, count: int):
    """``count`` other Ray jobs holding one CPU each (their submission ids), for the time of the ``with``."""
    client = JobSubmissionClient(cluster)
    jobs = [client.submit_job(entrypoint="sleep 600", entrypoint_num_cpus=1) for _ in range(count)]
    try:
        wait_until(lambda: all(client.get_job_status(j) == "RUNNING" for j in jobs), timeout=60,
                   what=f"{count} job(s) holding a CPU each")
        yield jobs
    finally:
        for job in jobs:
            client.stop_job(job)


def status_timeline(orch: Orchestrator, run_id: str) -> list[str]:
    return [e.message for e in orch.events(run_id) if e.kind == "status"]


def test_a_single_worker_waiting_for_a_cpu_is_cancelled_and_stopped_on_ray(studio, cluster, tiny_model):
    with cpus_taken(cluster, 2):
        run_id = studio.start(on_ray(tiny_model))
        wait_for_phase(studio, run_id, "waiting for the cluster: needs 1 CPU, 0 free")  # Ray holds the job
        assert job_status(cluster, run_id) == "PENDING"
        studio.cancel(run_id)
        snap = studio.wait(run_id, timeout=60)
        assert snap.status is RunStatus.CANCELLED, (snap.error, studio.log_tail(run_id))
        assert snap.error == "" and studio.metrics(run_id).empty
    # Ray stops the job only once it would start it (its supervisor waits for the CPU too): then it is STOPPED
    wait_until(lambda: job_status(cluster, run_id) == "STOPPED", timeout=60, what="Ray to stop the job")
    assert not any("progress" in e.kind for e in studio.events(run_id))


def test_two_workers_wait_for_a_cpu_and_start_by_themselves_when_it_is_freed(studio, cluster, tiny_model):
    with cpus_taken(cluster, 1) as jobs:
        run_id = studio.start(on_ray(tiny_model, num_processes=2))
        wait_for_phase(studio, run_id, "waiting for the cluster: needs 2 CPUs, 1 free")
        JobSubmissionClient(cluster).stop_job(jobs[0])  # the CPU is free again: Ray places the workers
        wait_until(lambda: (paths.run_dir(run_id) / PLACEMENT_FILE).exists(), timeout=120,
                   what="both ranks started")
    timeline = status_timeline(studio, run_id)
    waited = timeline.index("Starting: waiting for the cluster: needs 2 CPUs, 1 free")
    assert f"Starting: {PLACED}" in timeline[waited + 1:]  # the wait is over, said at once
    assert "waiting" not in studio.snapshot(run_id).phase
    placement = json.loads((paths.run_dir(run_id) / PLACEMENT_FILE).read_text())
    assert sorted(p["rank"] for p in placement) == [0, 1]
    ray_jobs.RayLauncher(cluster).adopt(studio.store.get_run(run_id)).kill()  # training it is test_ray_cluster's


def test_cpu_workers_are_estimated_against_the_ram_the_cluster_nodes_report(cluster, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", cluster)

    def reported():  # Ray's reporter agent on each node sends its first reading a few seconds after the start
        nodes, problem = ray_nodes.cluster_memory(cluster)
        assert problem == ""
        return nodes if len(nodes) == 2 and all(n.ram_total_gb > 0 for n in nodes) else None
    wait_until(reported, timeout=60, what="both nodes' memory on Ray's dashboard")
    device, dev = ray_nodes.run_worker_device(TrainConfig(launcher="ray", num_processes=3))
    ram = psutil.virtual_memory()  # the two nodes are this machine: the same RAM as Ray reads it (psutil)
    named = {f"RAM of Ray node {n.address} ({n.node_id[:12]})" for n in ray_jobs.cluster_info(cluster).nodes}
    assert device == "cpu" and dev.label in named  # one CPU each: not shared with another worker
    assert dev.total_gb == ram.total / memory.GB and 0 < dev.free_gb <= dev.total_gb
