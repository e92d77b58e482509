"""New run's memory estimate for a run on the Ray cluster is for the workers' devices, not this host's: the nodes'
GPUs and RAM as Ray's dashboard reports them (trainer_core/launchers/ray_nodes.py, a local HTTP server speaking
Ray 2.60's node summary with GPU nodes this machine does not have), the device one worker can count on
(trainer_core/planning/ray_memory.py) and the check before a start. The CPU path against a real local cluster is
in tests/launchers/test_ray_waiting.py."""
from __future__ import annotations

import math

import psutil
import pytest

from tests.support.apptest import fakes, open_new_run, texts  # noqa: F401 - fakes: a fixture
from tests.support.ray_cluster import node_summary_server
from trainer_core.config import TrainConfig
from trainer_core.jobs import resource_check
from trainer_core.launchers import ray as ray_jobs, ray_nodes
from trainer_core.planning import memory, model_info
from trainer_core.planning.ray_memory import NodeMemory, worker_memory

MIB = 1024 * 1024
GB = 1e9


def node_summary(node_id: str, ip: str, resources: dict, ram: tuple[int, int], gpus=(), state="ALIVE") -> dict:
    """One node of Ray 2.60's GET /nodes?view=summary (camelCased by its REST layer), cut to what is read: ``mem``
    is psutil's [total, available, percent, used], each of ``gpus`` NVML's name and memory in MiB."""
    return {"ip": ip, "mem": [ram[0], ram[1], 0.0, ram[0] - ram[1]],
            "gpus": [{"index": i, "name": name, "utilizationGpu": 0, "memoryUsed": used, "memoryTotal": total}
                     for i, (name, used, total) in enumerate(gpus)],
            "raylet": {"nodeId": node_id, "nodeManagerAddress": ip, "state": state, "resourcesTotal": resources}}


A100_NODE = node_summary("a" * 56, "10.0.0.2", {"CPU": 16.0, "GPU": 2.0, "acceleratorType:A100": 1.0},
                         (256 * 10**9, 200 * 10**9), [("NVIDIA A100-SXM4-80GB", 30000, 81920),
                                                      ("NVIDIA A100-SXM4-80GB", 500, 81920)])
A10_NODE = node_summary("b" * 56, "10.0.0.3", {"CPU": 8.0, "GPU": 1.0, "acceleratorType:A10G": 1.0},
                        (64 * 10**9, 60 * 10**9), [("NVIDIA A10G", 1000, 23028)])
HEAD = node_summary("c" * 56, "10.0.0.1", {"CPU": 4.0, "node:__internal_head__": 1.0}, (32 * 10**9, 8 * 10**9))
GONE = node_summary("d" * 56, "10.0.0.9", {"CPU": 64.0, "GPU": 8.0}, (10**12, 10**12), state="DEAD")
SUMMARY = {"result": True, "msg": "Node summary fetched.",
           "data": {"summary": [HEAD, A100_NODE, A10_NODE, GONE], "nodeLogicalResources": {}}}


@pytest.fixture
def dashboard(monkeypatch):
    """A local HTTP server answering /nodes?view=summary with SUMMARY, set as the server's RAY_ADDRESS."""
    with node_summary_server(SUMMARY) as address:
        monkeypatch.setenv("RAY_ADDRESS", address)
        monkeypatch.delenv("FINETUNE_STUDIO_RAY_ADDRESSES", raising=False)
        yield address


def test_the_nodes_gpus_and_ram_are_read_from_rays_node_summary(dashboard):
    nodes, problem = ray_nodes.cluster_memory(dashboard)
    assert problem == ""
    assert [n.node for n in nodes] == ["10.0.0.1 (cccccccccccc)", "10.0.0.2 (aaaaaaaaaaaa)", "10.0.0.3 (bbbbbbbbbbbb)"]
    head, a100, a10 = nodes  # the dead node is left out
    assert (head.cpus, head.gpu_count, head.gpus, head.ram_total_gb, head.ram_free_gb) == (4.0, 0.0, (), 32.0, 8.0)
    assert (a100.gpu_count, a100.accelerator) == (2.0, "A100")
    assert a100.gpus == (("NVIDIA A100-SXM4-80GB", pytest.approx((81920 - 30000) * MIB / GB), 81920 * MIB / GB),
                         ("NVIDIA A100-SXM4-80GB", pytest.approx((81920 - 500) * MIB / GB), 81920 * MIB / GB))
    assert a10.gpus == (("NVIDIA A10G", pytest.approx((23028 - 1000) * MIB / GB), 23028 * MIB / GB),)


def nodes() -> list[NodeMemory]:
    return ray_nodes.nodes_memory(SUMMARY["data"]["summary"])


def test_a_gpu_worker_counts_on_the_least_free_gpu_of_the_nodes_that_can_hold_it():
    one = worker_memory(nodes(), gpus_per_worker=1, workers=4)
    assert (one.device, one.label) == ("cuda", "NVIDIA A10G of Ray node 10.0.0.3 (bbbbbbbbbbbb)")
    assert (round(one.free_gb, 2), round(one.total_gb, 2)) == (23.10, 24.15)  # (23028 - 1000) MiB of 23028 MiB
    two = worker_memory(nodes(), gpus_per_worker=2, workers=2)  # only the A100 node has two GPUs
    assert two.label == "NVIDIA A100-SXM4-80GB of Ray node 10.0.0.2 (aaaaaaaaaaaa)"
    assert round(two.free_gb, 2) == round((81920 - 30000) * MIB / GB, 2) == 54.44  # the fuller of its two GPUs
    half = worker_memory(nodes(), gpus_per_worker=0.5, workers=4)  # two workers share one GPU
    assert half.label == "NVIDIA A10G of Ray node 10.0.0.3 (bbbbbbbbbbbb), 0.5 of it per worker"
    assert round(half.free_gb, 2) == round(one.free_gb / 2, 2)
    none = worker_memory(nodes(), gpus_per_worker=4, workers=1)
    assert none.label == "a Ray worker's GPU (no node has 4 GPU(s))" and math.isnan(none.free_gb)


def test_gpus_ray_counts_but_its_dashboard_cannot_read_are_unknown_not_guessed():
    blind = [NodeMemory("10.0.0.5 (eeeeeeeeeeee)", cpus=8, gpu_count=4, accelerator="H100")]
    dev = worker_memory(blind, gpus_per_worker=1, workers=1)
    assert dev.label == ("a Ray worker's GPU (H100) on 10.0.0.5 (eeeeeeeeeeee) (Ray's dashboard does not report its "
                         "memory)")
    assert math.isnan(dev.free_gb)


def test_cpu_workers_share_a_nodes_ram_one_per_cpu():
    dev = worker_memory(nodes(), gpus_per_worker=0, workers=3)
    # per worker: head 8 GB free / 3 workers (it has 4 CPUs), A100 node 200/3, A10G node 60/3: the head's is least
    assert (dev.device, dev.label) == ("cpu", "RAM of Ray node 10.0.0.1 (cccccccccccc), shared by 3 CPU workers")
    assert (round(dev.free_gb, 3), round(dev.total_gb, 3)) == (2.667, 10.667)
    alone = worker_memory(nodes(), gpus_per_worker=0, workers=1)
    assert (alone.label, alone.free_gb, alone.total_gb) == ("RAM of Ray node 10.0.0.1 (cccccccccccc)", 8.0, 32.0)


def test_the_estimate_of_a_gpu_run_on_the_cluster_is_judged_on_its_workers_gpu(dashboard):
    cfg = TrainConfig(launcher="ray", num_processes=2, ray_gpus_per_worker=1, max_seq_length=2048, batch_size=8)
    device, dev = ray_nodes.run_worker_device(cfg)
    info = model_info.inspect_model(cfg.model_name)
    est = memory.estimate_memory(info, cfg, device)
    level, text = memory.fit_message(est, dev, cfg, info)
    assert device == "cuda" and dev.label == "NVIDIA A10G of Ray node 10.0.0.3 (bbbbbbbbbbbb)"
    assert est.total_gb < memory.TIGHT_RATIO * dev.free_gb  # the bundled 135M model fits a 24 GB GPU
    assert (level, text) == ("ok", f"Fits: needs about {est.total_gb:.1f} GB of 23.1 GB free on {dev.label}.")


def test_the_check_before_a_start_judges_a_ray_run_on_the_workers_nodes_not_this_host(dashboard, home):
    huge = TrainConfig(launcher="ray", max_seq_length=131072, batch_size=64, num_processes=1)
    est = memory.estimate_memory(model_info.inspect_model(huge.model_name), huge, "cpu")
    assert est.total_gb > 2 * psutil.virtual_memory().total / GB  # this host would refuse it (a local run is)
    SUMMARY["data"]["summary"] = [node_summary("f" * 56, "10.0.0.7", {"CPU": 1.0},
                                               (int(est.total_gb * GB), int(est.total_gb * GB)))]
    try:
        assert resource_check.memory_problems(huge) == []  # within twice the node's RAM: the form's warning only
        SUMMARY["data"]["summary"] = [node_summary("f" * 56, "10.0.0.7", {"CPU": 1.0}, (10**9, 10**9))]
        [error] = resource_check.memory_problems(huge)
    finally:
        SUMMARY["data"]["summary"] = [HEAD, A100_NODE, A10_NODE, GONE]
    assert error.field == "memory" and "RAM of Ray node 10.0.0.7 (ffffffffffff)" in error.message
    assert "more than 2 times the 1.0 GB" in error.message


def test_a_cluster_that_does_not_answer_leaves_the_workers_memory_unknown(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:9")  # port 9: nobody listens
    device, dev = ray_nodes.run_worker_device(TrainConfig(launcher="ray"), timeout_s=2)
    assert device == "cpu" and math.isnan(dev.free_gb)
    assert dev.label.startswith("a Ray worker's RAM (http://127.0.0.1:9 did not report its nodes' memory (URLError")


def test_new_run_shows_the_estimate_for_a_ray_workers_gpu_and_the_global_batch_of_its_workers(fakes, dashboard,
                                                                                               monkeypatch):
    monkeypatch.setattr(ray_jobs, "cluster_info", lambda address, timeout_s=10.0: ray_jobs.ClusterInfo(address))
    fakes.free_gb = 0.5  # this host's memory, which must not be what the estimate is judged on
    at = open_new_run(nr_launcher="ray", nr_ray_gpus_per_worker=1.0, nr_num_processes=2, nr_batch_size=3)
    assert "Estimated need on CUDA" in {m.label for m in at.metric}
    captions = texts(at, "caption")
    assert any(c.startswith("NVIDIA A10G of Ray node 10.0.0.3 (bbbbbbbbbbbb): 23.1 GB free of 24.1 GB · ") and
               c.endswith("engine, per Ray worker") for c in captions), captions
    assert "2 data-parallel process(es): global batch 6 rows per step (batch 3 × accumulation 1 × 2)" in captions
    [fits] = texts(at, "success")
    assert fits.startswith("Fits: needs about ") and fits.endswith(
        " GB of 23.1 GB free on NVIDIA A10G of Ray node 10.0.0.3 (bbbbbbbbbbbb).")


def test_a_run_on_the_cluster_saved_in_settings_is_judged_on_its_nodes(dashboard, monkeypatch):
    """With RAY_ADDRESS unset, the cluster saved in Settings is the server's (config.server_cluster): a run naming
    no cluster goes there, and its estimate is its workers' device there, not 'no cluster this server may use'."""
    from trainer_core.protocol import cluster_settings

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(cluster_settings, "saved", lambda: cluster_settings.SavedCluster(dashboard, "/mnt", "ada", 1.0))
    cfg = TrainConfig(launcher="ray", num_processes=2, ray_gpus_per_worker=1)
    assert ray_nodes.run_address(cfg) == dashboard
    device, dev = ray_nodes.run_worker_device(cfg)
    assert device == "cuda" and dev.label == "NVIDIA A10G of Ray node 10.0.0.3 (bbbbbbbbbbbb)"
