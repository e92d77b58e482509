"""What the dashboard reads of a cluster without starting one: free CPUs and GPUs per node from Ray's dashboard
answer (a fake HTTP server speaking its JSON), the allowed addresses, and a silent cluster as a message."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support.ray_cluster import node_summary_server
from trainer_core.launchers import ray as ray_jobs

# Ray 2.60's answer to GET /nodes?view=summary, cut to what is read (the usage text of its Cluster page).
SUMMARY = {"result": True, "msg": "Node summary fetched.", "data": {"summary": [], "nodeLogicalResources": {
    "gpu-node": "1.0/3.0 CPU\n1.0/2.0 GPU\n0B/22.76GiB memory\n0B/76.29MiB object_store_memory",
    "cpu-node": "0.0/1.0 CPU\n0B/22.37GiB memory"}}}


@pytest.fixture
def dashboard():
    """A local HTTP server answering /nodes?view=summary with SUMMARY; its address."""
    with node_summary_server(SUMMARY) as address:
        yield address


def test_free_resources_are_read_per_node_from_the_dashboards_usage(dashboard):
    assert ray_jobs.free_resources(dashboard) == {"gpu-node": {"CPU": 2.0, "GPU": 1.0}, "cpu-node": {"CPU": 1.0}}


def test_a_node_missing_from_the_usage_has_unknown_free_capacity_except_of_what_it_has_none():
    state = SimpleNamespace(node_id="n1", node_ip="10.0.0.3", is_head_node=False, resources_total={"CPU": 4.0})
    assert ray_jobs.node_of(state, None) == ray_jobs.RayNode("n1", "10.0.0.3", False, 4.0, 0.0, None, 0.0)
    assert ray_jobs.node_of(state, {"CPU": 1.0}) == ray_jobs.RayNode("n1", "10.0.0.3", False, 4.0, 0.0, 1.0, 0.0)


def test_free_resources_of_a_dashboard_that_does_not_answer_are_unknown():
    assert ray_jobs.free_resources("http://127.0.0.1:9", timeout_s=2) == {}  # port 9: nobody listens


def test_a_cluster_that_does_not_answer_is_a_problem_naming_the_fix_not_an_exception():
    pytest.importorskip("ray", reason="without ray the problem is the install hint")
    info = ray_jobs.cluster_info("http://127.0.0.1:9")
    assert info.nodes == ()
    assert info.problem.startswith("the Ray cluster at http://127.0.0.1:9 cannot be used (ConnectionError: ")
    assert info.problem.endswith("check that it runs (`ray status` on its head) and that RAY_ADDRESS is its dashboard "
                                 "address, e.g. http://head:8265")
    assert ray_jobs.cluster_info("  ").problem.startswith("no Ray cluster address is set: set RAY_ADDRESS")


def test_the_servers_addresses_are_its_own_first_then_the_admins_list(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265/")
    monkeypatch.setenv("FINETUNE_STUDIO_RAY_ADDRESSES", " http://gpu-b:8265, ,http://head:8265")
    assert ray_jobs.server_addresses() == ["http://head:8265", "http://gpu-b:8265"]
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.delenv("FINETUNE_STUDIO_RAY_ADDRESSES")
    assert ray_jobs.server_addresses() == []


def test_a_cluster_reporting_no_alive_node_is_asked_again_then_a_problem_not_a_vacuous_pass(monkeypatch):
    """Under load Ray's state API once answered a one-node cluster's node list with no alive node, and Settings'
    shared-storage check passed over no node at all (CI, tests/launchers/test_ray_settings_save.py)."""
    pytest.importorskip("ray", reason="the node list is Ray's state API")
    import ray.util.state

    head = SimpleNamespace(node_id="h" * 56, node_ip="10.0.0.1", is_head_node=True, state="ALIVE",
                           resources_total={"CPU": 2.0})
    answers = [[], [SimpleNamespace(**{**vars(head), "state": "DEAD"})], [head]]
    monkeypatch.setattr(ray_jobs, "job_client", lambda address: None)
    monkeypatch.setattr(ray_jobs, "free_resources", lambda address, timeout_s=10.0: {})
    monkeypatch.setattr(ray_jobs.time, "sleep", lambda s: None)
    monkeypatch.setattr(ray.util.state, "list_nodes", lambda address, timeout: answers.pop(0))
    info = ray_jobs.cluster_info("http://head:8265")
    assert info.problem == "" and [n.node_id for n in info.nodes] == [head.node_id] and answers == []
    answers[:] = [[], [], []]
    info = ray_jobs.cluster_info("http://head:8265")
    assert info.nodes == () and info.problem == ("the Ray cluster at http://head:8265 answers but reports no alive "
                                                 "node: check `ray status` on its head, then check again")
    answers[:] = [[], [], []]
    check = ray_jobs.inspect_cluster("http://head:8265", shared="/mnt/shared")
    assert check.problems == (info.problem,)  # the storage check does not pass over no node
