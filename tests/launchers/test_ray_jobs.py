"""Eval and export jobs on the Ray cluster (``launcher: ray`` in their spec): what validation refuses, naming the
field and the fix (no cluster, run folders off the shared storage, GPUs named; a secret such a job needs travels
through its run folder: tests/launchers/test_ray_secrets.py), how such a job is routed and placed, the CLI flags, and, slow, on a one-node
local cluster: an export and an eval through the orchestrator as single-worker Ray jobs (artifacts and results on
the shared storage, no secret in Ray's job table), and Stop reaching a Ray eval adopted by a restarted dashboard."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from db.store import Store
from tests.support.factories import insert_finished_run
from trainer_core.__main__ import main as cli
from trainer_core.config import BUNDLED_MODEL, ConfigError, FieldError, TrainConfig
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.export.spec import ExportSpec
from trainer_core.jobs import evals
from trainer_core.jobs.launcher import PlacingLauncher, WorkerLauncher, cluster_devices, on_ray
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.specs.model_source import ModelSource
from trainer_core.launchers import ray as ray_jobs
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, write_kind

RUN_ID = "20260101-000000-a1a1a1"
NO_CLUSTER = FieldError("launcher", "launcher: ray runs the job on the server's Ray cluster, and none is configured: "
                                    "set RAY_ADDRESS (the cluster's dashboard, e.g. http://head:8265) in the server's "
                                    "environment or save a cluster in Settings, or run it on this host (launcher: "
                                    "local)")


@pytest.fixture
def shared(home, tmp_path, monkeypatch):
    """The data root on the "shared storage", and a cluster address in the server's environment."""
    monkeypatch.setenv("FINETUNE_STUDIO_SHARED_STORAGE", str(tmp_path))
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    return tmp_path


def finished_run(run_id: str = RUN_ID) -> None:
    """A finished LoRA run's folder as far as the specs look at it: its config and an adapter folder."""
    run_dir = paths.run_dir(run_id)
    (run_dir / "adapter").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(TrainConfig(model_name=BUNDLED_MODEL, run_name="trained").to_yaml())
    (run_dir / "adapter" / "adapter_config.json").write_text("{}")
    write_kind(run_dir, JobKind.TRAIN)


def export_on_ray(**values) -> ExportSpec:
    return ExportSpec(**{"source": ModelSource(run_id=RUN_ID), "targets": ["adapter"], "verify": False,
                         "launcher": "ray", **values})


def eval_on_ray(tmp_path, **values) -> EvalSpec:
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps({"instruction": "Say hello.", "output": "Hello!"}) + "\n")
    return EvalSpec(**{"source": ModelSource(run_id=RUN_ID), "data": str(data), "metrics": ["exact"],
                       "launcher": "ray", **values})


def test_an_eval_and_an_export_on_ray_validate_with_a_cluster_and_shared_storage(shared):
    finished_run()
    assert export_on_ray().validate() == []
    assert eval_on_ray(shared).validate() == []
    assert on_ray(export_on_ray()) and not on_ray(export_on_ray(launcher="local"))


def test_every_missing_piece_of_a_ray_job_is_named_with_its_fix(home, tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("FINETUNE_STUDIO_SHARED_STORAGE", raising=False)
    finished_run()
    storage = FieldError("launcher", "launcher: ray: run folders must be on storage every node of the Ray cluster "
                                     "mounts: set FINETUNE_STUDIO_SHARED_STORAGE to that path in the server's "
                                     "environment, with FINETUNE_STUDIO_HOME under it, or run it on this host "
                                     "(launcher: local)")
    gpus = FieldError("gpu_ids", "Ray places the job on the cluster: leave gpu_ids empty, or run it on this host "
                                 "(launcher: local)")
    assert export_on_ray(gpu_ids=[0]).validate() == [NO_CLUSTER, storage, gpus]
    assert eval_on_ray(tmp_path).validate() == [NO_CLUSTER, storage]
    assert export_on_ray(launcher="slurm").validate() == [
        FieldError("launcher", "choose local or ray (this host, or the server's Ray cluster)")]
    assert export_on_ray(launcher="local").validate() == []  # this host needs none of it


def test_an_export_folder_off_the_shared_storage_is_refused(shared, tmp_path, monkeypatch):
    finished_run()
    elsewhere = tmp_path / "local-disk"
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{shared}:{elsewhere}")
    (elsewhere / "exports").mkdir(parents=True)
    out = elsewhere / "exports" / "mine"
    monkeypatch.setenv("FINETUNE_STUDIO_SHARED_STORAGE", str(paths.data_root()))
    assert export_on_ray(out_dir=str(out)).validate() == [FieldError(
        "out_dir", f"launcher: ray: the job writes its artifacts from a node of the cluster, and {out} is not on the "
                   f"shared storage {paths.data_root()} (FINETUNE_STUDIO_SHARED_STORAGE): choose a folder under it, or "
                   "leave out_dir empty (the job folder's artifacts/)")]
    assert export_on_ray(out_dir=str(out), launcher="local").validate() == []
    inside = paths.data_root() / "exports" / "mine"
    assert export_on_ray(out_dir=str(inside)).validate() == []


def test_a_ray_job_goes_to_the_servers_cluster_and_never_waits_for_this_hosts_devices(shared, monkeypatch):
    finished_run()
    started = []
    monkeypatch.setattr(ray_jobs.RayLauncher, "start", lambda self, run_dir, cfg: started.append((self.address, cfg)))
    spec = export_on_ray()
    run_dir = paths.run_dir("job-1")
    PlacingLauncher(WorkerLauncher()).start(run_dir, spec)
    assert started == [("http://head:8265", spec)]
    assert cluster_devices(spec).startswith("ray-") and cluster_devices(export_on_ray(launcher="local")) is None
    monkeypatch.delenv("RAY_ADDRESS")  # the server lost its cluster while the job was queued
    with pytest.raises(OSError, match="launcher: ray: no Ray cluster is configured: set RAY_ADDRESS"):
        PlacingLauncher(WorkerLauncher()).start(run_dir, spec)


def test_an_eval_or_export_on_ray_asks_for_the_gpus_it_names_on_its_node(shared, monkeypatch):
    finished_run()
    submitted = []
    monkeypatch.setattr(ray_jobs, "job_client", lambda address: SimpleNamespace(
        submit_job=lambda **kwargs: submitted.append(kwargs)))
    for i, spec in enumerate((export_on_ray(ray_gpus_per_worker=1.0), eval_on_ray(shared, ray_gpus_per_worker=2.0),
                              export_on_ray())):
        assert spec.validate() == []
        run_dir = paths.run_dir(f"job-{i}")
        run_dir.mkdir(parents=True)
        ray_jobs.RayLauncher("http://head:8265").start(run_dir, spec)
    # none named: Ray gives the job no GPU (it runs on the node's CPU)
    assert [(j["entrypoint_num_cpus"], j["entrypoint_num_gpus"]) for j in submitted] == [(1, 1.0), (1, 2.0), (1, None)]
    for bad in (-1.0, float("nan"), float("inf"), 65.0, True, "1"):
        assert [e.field for e in export_on_ray(ray_gpus_per_worker=bad).validate()] == ["ray_gpus_per_worker"], bad
    assert export_on_ray(launcher="local", ray_gpus_per_worker=1.0).validate() == [FieldError(
        "ray_gpus_per_worker", "only for launcher: ray (Ray gives the node's GPUs): on this host the job takes its GPU "
                               "from gpu_ids; leave it 0")]


def test_the_orchestrator_refuses_a_ray_export_before_recording_it(home, store, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    finished_run()
    orch = Orchestrator(store=store, start_pump=False)
    try:
        with pytest.raises(ConfigError) as refused:
            orch.submit(export_on_ray())
        assert NO_CLUSTER in refused.value.errors and store.list_runs() == []
    finally:
        orch.close()


def test_the_cli_flags_send_an_eval_or_export_to_the_cluster(home, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    finished_run()
    insert_finished_run(Store(), RUN_ID, "trained", [1.0, 0.5])
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps({"instruction": "Say hello.", "output": "Hello!"}) + "\n")
    assert cli(["export", "trained", "--to", "adapter", "--launcher", "ray"]) == 2
    assert f"error: launcher: {NO_CLUSTER.message}" in capsys.readouterr().err
    assert cli(["eval", "trained", "--data", str(data), "--metrics", "exact", "--no-baseline",
                "--launcher", "ray"]) == 2
    assert f"error: launcher: {NO_CLUSTER.message}" in capsys.readouterr().err


# ====================================================================== on a real local cluster (slow)
@pytest.fixture(scope="module")
def cluster():
    """A one-node local cluster with two CPUs (tests/support/ray_cluster.py): the export and the eval run side by
    side."""
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
    from tests.support.ray_cluster import local_cluster

    with local_cluster(cpus_per_node=2, nodes=1) as running:
        yield running.address


@pytest.mark.ray
@pytest.mark.subprocess
def test_an_export_and_an_eval_run_as_ray_jobs_with_results_on_the_shared_storage(cluster, tmp_path, monkeypatch,
                                                                                   tiny_model):
    from ray.job_submission import JobSubmissionClient

    from tests.support.lora_runs import lora_run
    from tests.support import MODELS_CACHE, ROOT
    from trainer_core.host import hardware
    from trainer_core.data.sources import bundled_demo_path
    from trainer_core.protocol.status import RunStatus

    secret = "hf_server_secret_never_in_ray"
    for name, value in {"FINETUNE_STUDIO_SHARED_STORAGE": str(tmp_path), "FINETUNE_STUDIO_HOME": str(tmp_path / "home"),
                        "FINETUNE_STUDIO_MODELS": str(MODELS_CACHE), "FINETUNE_STUDIO_FORCE_CPU": "1",
                        "FINETUNE_STUDIO_ALLOWED_ROOTS": f"{tmp_path}:{ROOT / '.test-cache'}", "RAY_ADDRESS": cluster,
                        "HF_TOKEN": secret, "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    hardware.cuda_available.cache_clear()
    run_dir = lora_run(RUN_ID, str(tiny_model))  # a finished LoRA run of the tiny model
    data = tmp_path / "demo.jsonl"  # three rows of the bundled demo chat
    data.write_text("".join(bundled_demo_path().read_text().splitlines(keepends=True)[:3]))
    studio = Orchestrator()
    try:
        export_id = studio.submit(ExportSpec(source=ModelSource(run_id=RUN_ID), targets=["adapter"], verify=False,
                                             launcher="ray"))
        eval_id, baseline = studio.start_eval(EvalSpec(source=ModelSource(run_id=RUN_ID), data=str(data),
                                                       metrics=["exact"], max_new_tokens=4, baseline=False,
                                                       launcher="ray"))
        assert baseline is None
        for job_id in (export_id, eval_id):
            snap = studio.wait(job_id, timeout=240)
            assert snap.status is RunStatus.COMPLETED, (snap.error, studio.log_tail(job_id))

        artifacts = studio.artifacts(job_id=export_id)  # written by a node, in the job folder on the shared storage
        [artifact] = [a for a in artifacts if a.kind == "adapter"]
        written = Path(artifact.path)
        assert paths.run_dir(export_id) / "artifacts" in written.parents
        assert written.is_relative_to(tmp_path) and artifact.sha256 == hashlib.sha256(written.read_bytes()).hexdigest()
        result = studio.eval_result(eval_id)  # the pump read the job's events.jsonl into the store
        predictions = evals.read_predictions(eval_id)
        assert result.status is RunStatus.COMPLETED and result.metrics["samples"] == len(predictions) == 3
        assert result.metrics["exact"] == pytest.approx(sum(p["exact"] for p in predictions) / 3)

        jobs = {job.submission_id: job for job in JobSubmissionClient(cluster).list_jobs()}
        for job_id in (export_id, eval_id):
            job = jobs[ray_jobs.submission_id(job_id)]
            assert job.status == "SUCCEEDED" and job.metadata == {"finetune_studio_run": job_id}
            assert job.entrypoint.endswith(f"-m trainer_core.worker.ray_entry {paths.run_dir(job_id)}")
            assert secret not in json.dumps([job.entrypoint, job.metadata, job.runtime_env])
            assert "HF_TOKEN" not in job.runtime_env["env_vars"]
    finally:
        for run in studio.store.active_runs():  # a test that failed half-way: leave no job on the cluster
            ray_jobs.RayLauncher(cluster).adopt(run).kill()
        studio.close()


@pytest.mark.ray
@pytest.mark.subprocess
def test_stop_reaches_a_ray_eval_adopted_by_a_restarted_dashboard(cluster, tmp_path, monkeypatch, tiny_model):
    from ray.job_submission import JobSubmissionClient

    from tests.support import MODELS_CACHE, ROOT, wait_until
    from trainer_core.host import hardware
    from trainer_core.data.sources import bundled_demo_path
    from trainer_core.protocol.status import RunStatus

    for name, value in {"FINETUNE_STUDIO_SHARED_STORAGE": str(tmp_path), "FINETUNE_STUDIO_HOME": str(tmp_path / "home"),
                        "FINETUNE_STUDIO_MODELS": str(MODELS_CACHE), "FINETUNE_STUDIO_FORCE_CPU": "1",
                        "FINETUNE_STUDIO_ALLOWED_ROOTS": f"{tmp_path}:{ROOT / '.test-cache'}", "RAY_ADDRESS": cluster,
                        "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    hardware.cuda_available.cache_clear()
    data = tmp_path / "demo.jsonl"  # far more rows than the test waits for: Stop arrives while it generates
    data.write_text(bundled_demo_path().read_text() * 4)
    studio = Orchestrator()
    eval_id, _ = studio.start_eval(EvalSpec(source=ModelSource(model=str(tiny_model)), data=str(data), max_samples=0,
                                            metrics=["exact"], max_new_tokens=64, batch_size=1, launcher="ray"))
    wait_until(lambda: len(evals.read_predictions(eval_id)) >= 1, timeout=120, what="the first prediction")
    studio.close()  # the dashboard goes away; the Ray job evaluates on

    restarted = Orchestrator()
    try:
        wait_until(lambda: restarted._is_tracked(eval_id), timeout=30, what="adoption by the restarted dashboard")
        restarted.stop(eval_id)
        snap = restarted.wait(eval_id, timeout=120)
        assert snap.status is RunStatus.STOPPED, (snap.error, restarted.log_tail(eval_id))
        result = restarted.eval_result(eval_id)
        kept = evals.read_predictions(eval_id, limit=10_000)
        assert result.metrics["partial"] is True and result.metrics["samples"] == len(kept)
        assert 1 <= len(kept) < len(data.read_text().splitlines())
        client = JobSubmissionClient(cluster)  # the worker ended by itself, after its partial results
        wait_until(lambda: client.get_job_status(ray_jobs.submission_id(eval_id)) == "SUCCEEDED", timeout=60,
                   what="the Ray job to end")
    finally:
        for run in restarted.store.active_runs():
            ray_jobs.RayLauncher(cluster).adopt(run).kill()
        restarted.close()
