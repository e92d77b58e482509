"""Serve jobs on the Ray cluster (``launcher: ray`` in the serve spec): what validation refuses, naming the field and
the fix; where the worker listens on its node and what endpoint.json records; the dashboard finding a Ray job's
endpoint; a lost node as a clear end; the CLI flag and the Serve panel's "Where to run"; and, slow, on a one-node
local cluster: an endpoint answering a chat completion with the key (401 without), nothing of the key in Ray's job
table, adoption by a restarted dashboard, and Stop ending the Ray job."""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from db.entities import RunRecord
from db.store import Store
from tests.support.factories import insert_finished_run
from tests.support.apptest import open_page
from trainer_core.__main__ import main as cli
from trainer_core.config import BUNDLED_MODEL, FieldError, TrainConfig
from trainer_core.specs.model_source import ModelSource
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.launchers import ray as ray_jobs
from trainer_core.launchers.base import ALIVE, JobHandle, JobState
from trainer_core.protocol import events as ev
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus, write_kind
from trainer_core.serving import endpoint as endpoint_file
from trainer_core.serving.endpoint import NODE_ADDRESS_ENV, NODE_ID_ENV
from trainer_core.serving.spec import CLUSTER_PLAIN_HTTP, ServeSpec, hash_key
from trainer_core.worker.serve import ServeWorker, listen_host

BASE = ModelSource(model=BUNDLED_MODEL)
HASH = hash_key("k")
RUN_ID = "20260101-000000-5e5e5e"
HERE = "or run it on this host (launcher: local)"
NO_CLUSTER = "launcher: ray runs the job on the server's Ray cluster, and none is configured: set RAY_ADDRESS"


@pytest.fixture
def shared(home, tmp_path, monkeypatch):
    """The data root on the "shared storage", and a cluster address in the server's environment."""
    monkeypatch.setenv("FINETUNE_STUDIO_SHARED_STORAGE", str(tmp_path))
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    return tmp_path


def on_ray(**values) -> ServeSpec:
    return ServeSpec(**{"sources": [BASE], "api_key_hash": HASH, "launcher": "ray", **values})


# ---------------------------------------------------------------- validation
def test_a_serve_job_on_ray_validates_with_a_cluster_and_shared_storage(shared):
    assert on_ray().validate() == [] and on_ray(host="0.0.0.0").validate() == []
    assert ServeSpec.from_dict(on_ray().to_dict()).launcher == "ray"  # job.json keeps it


def test_every_missing_piece_of_a_ray_serve_job_is_named_with_its_fix(home, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("FINETUNE_STUDIO_SHARED_STORAGE", raising=False)
    cluster, storage, gpus = on_ray(gpu_ids=[0]).validate()  # the same checks as an eval's or export's (spec_problems)
    assert cluster.field == "launcher" and cluster.message.startswith(NO_CLUSTER) and cluster.message.endswith(HERE)
    assert storage.field == "launcher" and "FINETUNE_STUDIO_SHARED_STORAGE" in storage.message
    assert gpus == FieldError("gpu_ids", f"Ray places the job on the cluster: leave gpu_ids empty, {HERE}")
    assert on_ray(launcher="slurm").validate() == [
        FieldError("launcher", "choose local or ray (this host, or the server's Ray cluster)")]
    assert on_ray(launcher="local").validate() == []


def test_a_bind_address_or_tls_file_a_node_cannot_have_is_refused(shared, tmp_path, monkeypatch):
    assert on_ray(host="10.1.2.3").validate() == [FieldError(
        "host", "Ray places the server on a node, so '10.1.2.3' cannot be bound there: leave 127.0.0.1 (it listens on "
                f"the node's cluster address) or use 0.0.0.0 (every interface of the node), {HERE}")]
    elsewhere = tmp_path / "local-disk"
    elsewhere.mkdir()
    (elsewhere / "cert.pem").write_text("-")
    (elsewhere / "key.pem").write_text("-")
    monkeypatch.setenv("FINETUNE_STUDIO_SHARED_STORAGE", str(paths.data_root()))  # the TLS files are off it now
    errors = on_ray(tls_certfile=str(elsewhere / "cert.pem"), tls_keyfile=str(elsewhere / "key.pem")).validate()
    assert errors == [FieldError(name, f"launcher: ray: the server reads it on a node of the cluster, and "
                                       f"{elsewhere / file} is not on the shared storage {paths.data_root()} "
                                       "(FINETUNE_STUDIO_SHARED_STORAGE): put it under it")
                      for name, file in (("tls_certfile", "cert.pem"), ("tls_keyfile", "key.pem"))]


def test_gpus_on_the_node_are_asked_for_and_vllm_needs_them(shared, monkeypatch):
    assert on_ray(engine="vllm").validate() == [FieldError(
        "engine", "vLLM needs a GPU, and on the cluster the server gets one only when it asks: set ray_gpus_per_worker "
                  "to 1, or use auto or transformers")]
    assert on_ray(engine="vllm", ray_gpus_per_worker=1.0).validate() == []  # the node's CUDA, not this host's
    assert [e.field for e in on_ray(ray_gpus_per_worker=-1.0).validate()] == ["ray_gpus_per_worker"]
    assert on_ray(launcher="local", ray_gpus_per_worker=1.0).validate() == [FieldError(
        "ray_gpus_per_worker", "only for launcher: ray (Ray gives the node's GPUs): on this host the job takes its GPU "
                               "from gpu_ids; leave it 0")]
    submitted = []
    monkeypatch.setattr(ray_jobs, "job_client", lambda address: SimpleNamespace(
        submit_job=lambda **kwargs: submitted.append(kwargs)))
    run_dir = paths.run_dir("job-1")
    run_dir.mkdir(parents=True)
    ray_jobs.RayLauncher("http://head:8265").start(run_dir, on_ray(ray_gpus_per_worker=1.0))
    [job] = submitted
    assert (job["entrypoint_num_cpus"], job["entrypoint_num_gpus"]) == (1, 1.0)
    assert job["entrypoint"].endswith(f"-m trainer_core.worker.ray_entry {run_dir}") and HASH not in json.dumps(job)


# ---------------------------------------------------------------- the worker on its node
def test_the_worker_listens_on_its_nodes_address_and_records_the_node(tmp_path, monkeypatch):
    monkeypatch.delenv(NODE_ADDRESS_ENV, raising=False)
    assert listen_host(ServeSpec(host="0.0.0.0")) == "0.0.0.0"  # this host: the spec's address
    with pytest.raises(RuntimeError, match="not told its node's address"):
        listen_host(on_ray())
    monkeypatch.setenv(NODE_ADDRESS_ENV, "10.0.0.7")
    monkeypatch.setenv(NODE_ID_ENV, "aea91b764f34" + "0" * 44)
    assert listen_host(on_ray()) == "10.0.0.7" and listen_host(on_ray(host="0.0.0.0")) == "0.0.0.0"
    for host in ("127.0.0.1", "0.0.0.0"):  # every interface of the node: the dashboard still reaches its address
        worker = ServeWorker(tmp_path)
        worker.engine, worker.host = "transformers", listen_host(on_ray(host=host))
        worker.announce(on_ray(host=host), [], [], 43117)
        worker.events.close()
        found = endpoint_file.read(tmp_path)
        assert (found.url, found.share_url, found.node) == ("http://10.0.0.7:43117/v1", "http://10.0.0.7:43117/v1",
                                                            "10.0.0.7 (aea91b764f34)")
    warnings = [e.message for e in ev.read_new(tmp_path / "events.jsonl", 0)[0] if isinstance(e, ev.WarningEvent)]
    assert warnings == [CLUSTER_PLAIN_HTTP] * 2  # the cluster's network, not "keep it on 127.0.0.1"


class Handle(JobHandle):
    """A Ray job as the launcher would answer for it, without a cluster."""

    def __init__(self, state: JobState):
        self.answer = state

    def record(self) -> dict:
        return {}

    def state(self) -> JobState:
        return self.answer

    def request_stop(self) -> None:
        pass

    def kill(self) -> None:
        pass


def test_the_dashboard_finds_a_ray_jobs_endpoint_while_ray_says_it_runs(home, store, monkeypatch):
    orch = Orchestrator(store=store, start_pump=False)
    handle = Handle(ALIVE)
    monkeypatch.setattr(orch.launcher, "adopt", lambda run: handle)
    try:
        run_dir = paths.run_dir("job-1")
        run_dir.mkdir(parents=True)
        store.create_run(RunRecord(id="job-1", name="e", status=RunStatus.RUNNING, kind=JobKind.SERVE,
                                   created_at=time.time(), output_dir=str(run_dir), pid=None))
        models = [{"name": "m", "label": "m", "source_key": "base:m"}]
        endpoint_file.write(run_dir, "http://10.0.0.7:1/v1", models, "transformers", pid=4242)
        assert orch.endpoint("job-1") is None  # no node: not written by a Ray job's worker
        endpoint_file.write(run_dir, "http://10.0.0.7:1/v1", models, "transformers", pid=4242, node="10.0.0.7 (a)")
        assert orch.endpoint("job-1").url == "http://10.0.0.7:1/v1"  # the node's pid says nothing on this host
        handle.answer = JobState(False, "ended on the Ray cluster as FAILED")
        assert orch.endpoint("job-1") is None
    finally:
        orch.close()


RAY_NODE_DIED = ("Job supervisor actor died: The actor died unexpectedly before finishing this task.\n\tclass_name: "
                 "JobSupervisor\n\tip: 10.0.0.7\nThe actor died because its node has died. Node Id: aea91b764f34aa\n"
                 "\tthe actor's node was terminated unexpectedly: health check failed due to missing too many "
                 "heartbeats")  # Ray 2.60's message, as a lost node left it on a local cluster


def test_a_job_whose_node_was_lost_ends_naming_the_node(monkeypatch):
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
    import ray.util.state
    from ray.job_submission import JobStatus

    info = SimpleNamespace(status=JobStatus.FAILED, message=RAY_NODE_DIED, driver_node_id="aea91b764f34aa")
    handle = ray_jobs.RayHandle("http://head:8265", "finetune-studio-x")
    handle._client = SimpleNamespace(get_job_info=lambda job_id: info)
    asked = []

    def get_node(node_id, address=None, timeout=30):
        asked.append((node_id, address))
        return SimpleNamespace(node_ip="10.0.0.7", state_message="Unexpected termination: health check failed")

    monkeypatch.setattr(ray.util.state, "get_node", get_node)
    assert handle.state() == JobState(False, "was lost with its node 10.0.0.7 (aea91b764f34) on the Ray cluster "
                                             "(Unexpected termination: health check failed)")
    assert asked == [("aea91b764f34aa", "http://head:8265")]
    monkeypatch.setattr(ray.util.state, "get_node", lambda *a, **k: (_ for _ in ()).throw(ConnectionError("down")))
    assert ray_jobs.lost_with_node("http://head:8265", "aea91b764f34aa") == \
        "was lost with its node (aea91b764f34) on the Ray cluster"


# ---------------------------------------------------------------- CLI and page
def finished_run() -> None:
    run_dir = paths.run_dir(RUN_ID)
    (run_dir / "adapter").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(TrainConfig(model_name=BUNDLED_MODEL, run_name="tone").to_yaml())
    (run_dir / "adapter" / "adapter_config.json").write_text("{}")
    write_kind(run_dir, JobKind.TRAIN)


def test_the_cli_sends_serve_to_the_cluster(home, monkeypatch, capsys):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    finished_run()
    insert_finished_run(Store(), RUN_ID, "tone", [1.0, 0.5])
    assert cli(["serve", "tone", "--launcher", "ray"]) == 2
    assert f"error: launcher: {NO_CLUSTER}" in capsys.readouterr().err


def test_the_serve_panel_offers_the_cluster_and_shows_the_node(app_home, monkeypatch):
    started = []

    def start_server(orch, sources, **kwargs):
        started.append(kwargs)
        return "20260105-100300-dddddd", "k"

    finished_run()
    insert_finished_run(Store(), RUN_ID, "tone", [1.0, 0.5])
    at = open_page("pages/run.py", detail_run_id=RUN_ID)
    assert not at.exception and not [r for r in at.radio if r.key == f"serve_place_{RUN_ID}"]  # no cluster: no choice

    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    monkeypatch.setattr(ray_jobs, "cluster_info", lambda address: ray_jobs.ClusterInfo(address, (
        ray_jobs.RayNode("aea91b764f34aa", "10.0.0.7", True, 4.0, 1.0, 3.0, 1.0),)))
    monkeypatch.setattr(Orchestrator, "start_server", start_server)
    at = open_page("pages/run.py", detail_run_id=RUN_ID)
    at.radio(key=f"serve_place_{RUN_ID}").set_value("ray").run()
    at.number_input(key=f"serve_gpus_{RUN_ID}").set_value(1.0).run()
    assert not at.exception
    assert any("1 node(s) · GPUs: 1 free of 1 · CPUs: 3 free of 4" in c.value for c in at.caption)
    assert [w for w in at.warning if "cross the cluster's network unencrypted" in w.value]
    at.button(key=f"serve_start_{RUN_ID}").click().run()
    assert [(k["launcher"], k["host"], k["ray_gpus_per_worker"]) for k in started] == [("ray", "127.0.0.1", 1.0)]


def test_a_serve_jobs_page_names_its_ray_node(app_home):
    store = Store()
    run_dir = paths.run_dir("20260105-100400-eeeeee")
    run_dir.mkdir(parents=True)
    spec = {"purpose": "endpoint", "sources": [{"model": BUNDLED_MODEL}], "api_key_hash": HASH, "launcher": "ray"}
    store.create_run(RunRecord(id=run_dir.name, name="On the cluster", status=RunStatus.RUNNING, kind=JobKind.SERVE,
                               created_at=time.time(), output_dir=str(run_dir), config_json=json.dumps(spec)))
    endpoint_file.write(run_dir, "http://10.0.0.7:43117/v1", [{"name": "m", "label": "m", "source_key": "base:m"}],
                        "transformers", 4242, node="10.0.0.7 (aea91b764f34)")
    (run_dir / ray_jobs.JOB_FILE).write_text(json.dumps({"address": "http://head:8265", "job_id": "x"}))
    import trainer_core.jobs.launcher as placing

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(placing.ray_jobs.RayLauncher, "adopt", lambda self, run: Handle(ALIVE))
        at = open_page("pages/run.py", detail_run_id=run_dir.name)
    assert not at.exception
    assert any("`http://10.0.0.7:43117/v1`" in m.value and "Ray node `10.0.0.7 (aea91b764f34)`" in m.value
               for m in at.markdown)


# ====================================================================== on a real local cluster (slow)
@pytest.mark.ray
@pytest.mark.subprocess
def test_a_ray_serve_job_answers_through_its_endpoint_and_stop_ends_it(tmp_path, monkeypatch, tiny_model):
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
    import httpx
    import openai
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import get_node

    from tests.support.ray_cluster import local_cluster
    from tests.support import MODELS_CACHE, ROOT, wait_until
    from trainer_core.host import hardware

    began = time.monotonic()
    with local_cluster(cpus_per_node=1, nodes=1) as cluster:
        cluster_s = time.monotonic() - began
        for name, value in {"FINETUNE_STUDIO_SHARED_STORAGE": str(tmp_path),
                            "FINETUNE_STUDIO_HOME": str(tmp_path / "home"), "FINETUNE_STUDIO_MODELS": str(MODELS_CACHE),
                            "FINETUNE_STUDIO_FORCE_CPU": "1", "RAY_ADDRESS": cluster.address, "OMP_NUM_THREADS": "1",
                            "HF_TOKEN": "hf_server_secret_never_in_ray",
                            "FINETUNE_STUDIO_ALLOWED_ROOTS": f"{tmp_path}:{ROOT / '.test-cache'}"}.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("DATABASE_URL", raising=False)
        hardware.cuda_available.cache_clear()
        studio = Orchestrator()
        restarted = None
        try:
            submitted = time.monotonic()
            job_id, key = studio.start_server([ModelSource(model=str(tiny_model))], purpose="endpoint",
                                              launcher="ray", idle_timeout_s=0)
            wait_until(lambda: studio.endpoint(job_id) is not None or studio.get_run(job_id).status.is_terminal(),
                       timeout=150, what="the server on the cluster to listen")
            endpoint = studio.endpoint(job_id)
            assert endpoint is not None, (studio.get_run(job_id).error, studio.log_tail(job_id))
            ready_s = time.monotonic() - submitted
            client = JobSubmissionClient(cluster.address)
            job = client.get_job_info(ray_jobs.submission_id(job_id))
            node = get_node(job.driver_node_id, address=cluster.address)
            assert endpoint.url.startswith(f"http://{node.node_ip}:") and endpoint.url.endswith("/v1")
            assert endpoint.node == f"{node.node_ip} ({job.driver_node_id[:12]})"

            asked = time.monotonic()
            reply = openai.OpenAI(base_url=endpoint.url, api_key=key, max_retries=0).chat.completions.create(
                model=endpoint.models[0].name, messages=[{"role": "user", "content": "Hello"}], max_tokens=4,
                temperature=0)
            answer_s = time.monotonic() - asked
            assert reply.choices[0].message.role == "assistant" and reply.choices[0].finish_reason in ("stop", "length")
            for headers in ({}, {"Authorization": "Bearer not-the-key"}):  # the gate runs on the node too
                assert httpx.get(f"{endpoint.url}/models", headers=headers, timeout=10).status_code == 401
                assert httpx.post(f"{endpoint.url}/chat/completions", headers=headers, timeout=10, json={
                    "model": endpoint.models[0].name, "messages": [{"role": "user", "content": "Hi"}]}).status_code == 401

            shown = json.dumps([[j.entrypoint, j.metadata, j.runtime_env] for j in client.list_jobs()])
            assert ray_jobs.submission_id(job_id) in json.dumps([j.submission_id for j in client.list_jobs()])
            assert key not in shown and hash_key(key) not in shown  # the key (and its hash) stay in the job folder
            assert "hf_server_secret_never_in_ray" not in shown  # and a serve job needs no secret of the server's

            checked = time.monotonic()
            studio.close()  # the dashboard goes away; the server keeps serving on its node
            restarted = Orchestrator()
            wait_until(lambda: restarted._is_tracked(job_id), timeout=30, what="adoption by the restarted dashboard")
            assert restarted.endpoint(job_id) == endpoint
            models = httpx.get(f"{endpoint.url}/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
            assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == [endpoint.models[0].name]

            adopted_s = time.monotonic() - checked
            stopping = time.monotonic()
            restarted.stop(job_id)
            snap = restarted.wait(job_id, timeout=60)
            assert snap.status is RunStatus.STOPPED, (snap.error, restarted.log_tail(job_id))
            wait_until(lambda: client.get_job_status(ray_jobs.submission_id(job_id)) == "SUCCEEDED", timeout=30,
                       what="the Ray job to end")
            assert restarted.endpoint(job_id) is None and endpoint_file.read(paths.run_dir(job_id)) is None
            print(f"ray serve: cluster {cluster_s:.1f} s, endpoint ready {ready_s:.1f} s after submission, first "
                  f"answer {answer_s:.2f} s, adopted {adopted_s:.1f} s, stopped {time.monotonic() - stopping:.1f} s")
        finally:
            for orch in filter(None, (studio, restarted)):
                for run in orch.store.active_runs():  # a test that failed half-way: leave no job on the cluster
                    ray_jobs.RayLauncher(cluster.address).adopt(run).kill()
                orch.close()
            hardware.cuda_available.cache_clear()


def test_tls_files_off_the_shared_storage_saved_in_settings_are_refused_too(home, tmp_path, monkeypatch):
    """A cluster saved in Settings is the server's cluster when the environment names none (config.server_cluster):
    its shared path is the one a node reads the TLS files from."""
    from trainer_core.protocol import cluster_settings

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("FINETUNE_STUDIO_SHARED_STORAGE", raising=False)
    monkeypatch.setattr(cluster_settings, "saved",
                        lambda: cluster_settings.SavedCluster("http://head:8265", str(paths.data_root()), "ada", 1.0))
    elsewhere = tmp_path / "local-disk"
    elsewhere.mkdir()
    (elsewhere / "cert.pem").write_text("-")
    (elsewhere / "key.pem").write_text("-")
    assert on_ray().validate() == []
    errors = on_ray(tls_certfile=str(elsewhere / "cert.pem"), tls_keyfile=str(elsewhere / "key.pem")).validate()
    assert errors == [FieldError(name, f"launcher: ray: the server reads it on a node of the cluster, and "
                                       f"{elsewhere / file} is not on the shared storage {paths.data_root()} "
                                       "(saved in Settings): put it under it")
                      for name, file in (("tls_certfile", "cert.pem"), ("tls_keyfile", "key.pem"))]


PIPES = """
import json, sys
from pathlib import Path
from trainer_core.launchers import ray as ray_jobs
from trainer_core.serving import endpoint
print(json.dumps([endpoint.read(Path(sys.argv[1])), ray_jobs.read_job(Path(sys.argv[1]))]))
"""


def test_named_pipes_in_place_of_endpoint_json_and_ray_job_json_are_not_waited_on(tmp_path):
    """endpoint.json is written by a node for a Ray serve job, ray_job.json is read when a job is adopted: a named
    pipe at either name (anyone who can write the job folder on the shared storage can make one) made the Serve
    panel, the CLI's wait and the pump's adoption wait forever for a writer."""
    import os

    from tests.support import run_python

    run_dir = tmp_path / "job"
    run_dir.mkdir()
    os.mkfifo(run_dir / endpoint_file.ENDPOINT_FILE)
    os.mkfifo(run_dir / ray_jobs.JOB_FILE)
    result = run_python(PIPES, str(run_dir), timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == [None, {}]
    os.remove(run_dir / ray_jobs.JOB_FILE)
    for junk in ("[1, 2]", "[" * 100_000, "null"):
        (run_dir / ray_jobs.JOB_FILE).write_text(junk)
        assert ray_jobs.read_job(run_dir) == {}
