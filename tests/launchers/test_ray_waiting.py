"""A Ray run the cluster cannot place yet shows "waiting for the cluster: needs N, M free" on a real local cluster
(tests/ray_support.py: two nodes of one CPU each): three workers wait for a third CPU until Cancel ends them; a
single-worker run waits while two other jobs hold both CPUs, and starts by itself and trains once one of them
ends. The same cluster's nodes give New run's estimate of CPU workers its memory (their RAM as Ray's dashboard
reports it; the GPU path is tests/launchers/test_ray_worker_memory.py). Skips without ray."""
from __future__ import annotations

import psutil
import pytest

from tests.ray_support import local_cluster
from tests.support import MODELS_CACHE, ROOT, wait_until
from trainer_core.__main__ import _status_text
from trainer_core.config import TrainConfig
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.launchers import ray as ray_jobs, ray_nodes
from trainer_core.planning import memory
from trainer_core.planning import hardware
from trainer_core.protocol.status import RunStatus
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


def test_a_single_worker_waits_while_the_cpus_are_taken_and_starts_when_one_is_freed(studio, cluster, tiny_model):
    client = JobSubmissionClient(cluster)
    blockers = [client.submit_job(entrypoint="sleep 600", entrypoint_num_cpus=1) for _ in range(2)]
    try:
        wait_until(lambda: all(client.get_job_status(b) == "RUNNING" for b in blockers), timeout=60,
                   what="two jobs holding both CPUs")
        run_id = studio.start(on_ray(tiny_model))
        wait_for_phase(studio, run_id, "waiting for the cluster: needs 1 CPU, 0 free")
        assert job_status(cluster, run_id) == "PENDING"
        client.stop_job(blockers[0])  # a CPU becomes free: Ray starts the run by itself
        snap = studio.wait(run_id, timeout=180)
    finally:
        for blocker in blockers:
            client.stop_job(blocker)
    assert snap.status is RunStatus.COMPLETED, (snap.error, studio.log_tail(run_id))
    assert list(studio.metrics(run_id).dropna(subset=["loss"])["step"]) == [1, 2]
    timeline = [e.message for e in studio.events(run_id) if e.kind == "status"]
    waited = timeline.index("Starting: waiting for the cluster: needs 1 CPU, 0 free")
    assert any(m.startswith("Starting: ") and "waiting" not in m for m in timeline[waited + 1:])  # the wait ended


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
