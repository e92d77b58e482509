"""The Ray cluster on Settings and New run, through AppTest, with the cluster faked (monkeypatched
``cluster_info``/``inspect_cluster``): the server's addresses read-only, "Check cluster" with its nodes and the
node that cannot see the shared storage named, who may check, "Where to run" mapping to launcher/num_processes/
ray_gpus_per_worker, the capacity cached, and a cluster that does not answer as a warning. The real check against
a local two-node cluster is tests/launchers/test_ray_settings_check.py."""
from __future__ import annotations

from dataclasses import replace

import pytest
from streamlit.testing.v1 import AppTest

from db import users
from tests.support import run_python
from tests.support.apptest import APP, TIMEOUT, click, fakes, open_new_run, texts  # noqa: F401 - fakes is a fixture
from trainer_core.config import presets
from trainer_core.auth.access import Role
from trainer_core.config import TrainConfig
from trainer_core.launchers import ray as ray_jobs
from ui import auth, ray_cluster
from ui.state import get_orchestrator

ADDRESS = "http://head.example:8265"
HEAD = ray_jobs.RayNode("a" * 56, "10.0.0.1", True, cpus=4, gpus=0, free_cpus=3, free_gpus=0)
GPU_NODE = ray_jobs.RayNode("b" * 56, "10.0.0.2", False, cpus=8, gpus=2, free_cpus=8, free_gpus=1)
INFO = ray_jobs.ClusterInfo(ADDRESS, (HEAD, GPU_NODE))


@pytest.fixture
def no_cluster(monkeypatch):
    for name in ("RAY_ADDRESS", "FINETUNE_STUDIO_RAY_ADDRESSES", "FINETUNE_STUDIO_SHARED_STORAGE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def cluster(no_cluster, monkeypatch, tmp_path):
    """A configured cluster whose answers are faked; ``asked`` records the addresses asked."""
    monkeypatch.setenv("RAY_ADDRESS", ADDRESS)
    monkeypatch.setenv("FINETUNE_STUDIO_SHARED_STORAGE", str(tmp_path))
    asked = []

    def cluster_info(address, timeout_s=10.0):
        asked.append(address)
        return INFO

    monkeypatch.setattr(ray_jobs, "cluster_info", cluster_info)
    return asked


def settings_page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("pages/settings.py").run()
    assert not at.exception, at.exception
    return at


def check_button(at: AppTest):
    return next(b for b in at.button if b.label == "Check cluster")


# ---------------------------------------------------------------------- Settings
def test_settings_says_how_to_configure_a_cluster_when_there_is_none(app_home, no_cluster):
    at = settings_page()
    assert "Ray cluster" in [s.value for s in at.subheader]
    [info] = [i.value for i in at.info if "Ray cluster" in i.value]
    assert info.startswith("No Ray cluster is configured: runs go to this host. To run on a cluster, set "
                           "`RAY_ADDRESS` to the cluster's dashboard address")
    assert "FINETUNE_STUDIO_SHARED_STORAGE" in info
    assert not [b for b in at.button if b.label == "Check cluster"]


def test_settings_check_lists_the_nodes_and_names_the_node_without_the_shared_storage(app_home, cluster, tmp_path,
                                                                                       monkeypatch):
    missing = "[Errno 2] No such file or directory"
    checked = ray_jobs.ClusterCheck(
        ray_jobs.ClusterInfo(ADDRESS, (replace(HEAD, shared=""), replace(GPU_NODE, shared=missing))),
        str(tmp_path), (f"node 10.0.0.2 (bbbbbbbbbbbb) cannot share files with this host under {tmp_path}: its probe "
                        f"file is missing here ({missing})",))
    asked = []
    monkeypatch.setattr(ray_jobs, "inspect_cluster", lambda address, timeout_s=120.0: asked.append(address) or checked)
    at = settings_page()
    [shown] = [m.value for m in at.markdown if "Cluster address" in m.value]
    assert shown == f"Cluster address: `{ADDRESS}` (`RAY_ADDRESS`)  \nShared storage: `{tmp_path}` (`FINETUNE_STUDIO_SHARED_STORAGE`)"
    assert asked == []  # nothing is submitted to the cluster until asked
    check_button(at).click().run()
    assert not at.exception, at.exception
    assert asked == [ADDRESS]
    assert (f"The Ray cluster at {ADDRESS} answers: 2 node(s) · GPUs: 1 free of 2 · CPUs: 11 free of 12."
            in [s.value.replace("\\", "") for s in at.success])
    table = at.dataframe[-1].value
    assert table.to_dict("records") == [
        {"node": "aaaaaaaaaaaa (head)", "address": "10.0.0.1", "CPUs free": "3 of 4", "GPUs free": "0 of 0",
         "shared storage": "sees it"},
        {"node": "bbbbbbbbbbbb", "address": "10.0.0.2", "CPUs free": "8 of 8", "GPUs free": "1 of 2",
         "shared storage": f"cannot see it: {missing}"}]
    [error] = [e.value.replace("\\", "") for e in at.error]
    assert error.startswith("node 10.0.0.2 (bbbbbbbbbbbb) cannot share files with this host under ")
    assert not [s for s in at.success if "Every node sees" in s.value]


def test_settings_check_of_a_cluster_that_does_not_answer_is_a_message(app_home, cluster, monkeypatch):
    problem = ray_jobs.unreachable(ADDRESS, ConnectionError("Failed to connect to Ray"))
    monkeypatch.setattr(ray_jobs, "inspect_cluster",
                        lambda address, timeout_s=120.0: ray_jobs.ClusterCheck(
                            ray_jobs.ClusterInfo(address, problem=problem), "/shared", (problem,)))
    at = settings_page()
    check_button(at).click().run()
    assert not at.exception, at.exception
    assert [e.value.replace("\\", "") for e in at.error] == [
        f"the Ray cluster at {ADDRESS} cannot be used (ConnectionError: Failed to connect to Ray): check that it runs "
        "(`ray status` on its head) and that RAY_ADDRESS is its dashboard address, e.g. http://head:8265"]
    assert not at.dataframe


def test_settings_check_without_shared_storage_lists_the_nodes_and_says_what_to_set(app_home, cluster, monkeypatch):
    monkeypatch.delenv("FINETUNE_STUDIO_SHARED_STORAGE")  # the real check; only the cluster's answer is faked
    at = settings_page()
    [shown] = [m.value for m in at.markdown if "Cluster address" in m.value]
    assert "Shared storage: not set (`FINETUNE_STUDIO_SHARED_STORAGE`)" in shown
    check_button(at).click().run()
    assert not at.exception, at.exception
    [nodes] = [d.value for d in at.dataframe if "node" in d.value.columns]
    assert list(nodes.columns) == ["node", "address", "CPUs free", "GPUs free"]  # no probe ran
    assert [e.value.replace("\\", "") for e in at.error] == [
        "run folders must be on storage every node of the Ray cluster mounts: set FINETUNE_STUDIO_SHARED_STORAGE to "
        "that path in the server's environment, with FINETUNE_STUDIO_HOME under it"]


def test_every_allowed_cluster_is_listed_and_the_chosen_one_is_checked(app_home, cluster, monkeypatch):
    other = "http://gpu-b:8265"
    monkeypatch.setenv("FINETUNE_STUDIO_RAY_ADDRESSES", f"{other}, {ADDRESS}/")
    asked = []
    monkeypatch.setattr(ray_jobs, "inspect_cluster", lambda address, timeout_s=120.0: asked.append(address) or
                        ray_jobs.ClusterCheck(ray_jobs.ClusterInfo(address, (HEAD,)), "/shared"))
    at = settings_page()
    [shown] = [m.value for m in at.markdown if "Cluster address" in m.value]
    assert shown.startswith(f"Cluster address: `{ADDRESS}` (`RAY_ADDRESS`)  \nAlso allowed for runs "
                            f"(`FINETUNE_STUDIO_RAY_ADDRESSES`): `{other}`  \n")
    picker = at.selectbox(key="settings_ray_address")
    assert picker.options == [ADDRESS, other]
    picker.set_value(other).run()
    check_button(at).click().run()
    assert asked == [other]
    assert "Every node sees the shared storage /shared: run folders there work on the cluster." in [
        s.value.replace("\\", "") for s in at.success]


@pytest.mark.parametrize("name, may_check", [("val", False), ("ann", True), ("ada", True)])
def test_operators_and_admins_may_check_the_cluster(app_home, cluster, monkeypatch, name, may_check):
    store = get_orchestrator().store
    for user, role in (("val", Role.VIEWER), ("ann", Role.OPERATOR), ("ada", Role.ADMIN)):
        users.ensure_user(store, user, role)
    monkeypatch.setenv(auth.SHARED_ENV, "1")  # as tests/test_access.py: nginx's headers, without nginx
    monkeypatch.setattr(auth, "proxy_user", lambda: name)
    monkeypatch.setattr(auth, "proxy_session", lambda: users.get_user(store, name).session_generation)
    at = settings_page()
    assert check_button(at).disabled is not may_check
    assert ("Only operators and admins can check the cluster (the check runs a probe job on it)."
            in [i.value for i in at.info]) is not may_check


# ---------------------------------------------------------------------- New run
def test_new_run_without_a_cluster_runs_here_and_says_how_to_add_one(fakes, no_cluster):  # noqa: F811
    at = open_new_run()
    assert not [r for r in at.radio if r.key == "nr_launcher"]
    assert any(c.startswith("Runs on this host. To offer a Ray cluster here, set `RAY_ADDRESS`")
               for c in texts(at, "caption"))
    assert at.number_input(key="nr_num_processes").label == "Processes (0: one per GPU)"


def test_new_run_on_the_cluster_shows_its_capacity_and_builds_a_ray_config(fakes, cluster):  # noqa: F811
    at = open_new_run()
    where = at.radio(key="nr_launcher")
    assert where.options == ["This host", "The Ray cluster"] and where.value == "local"
    assert cluster == []  # the cluster is asked only once it is chosen
    where.set_value("ray").run()
    at.number_input(key="nr_num_processes").set_value(2).run()
    at.number_input(key="nr_ray_gpus_per_worker").set_value(1.0).run()
    at.number_input(key="nr_ray_max_failures").set_value(2).run()
    assert not at.exception, at.exception
    assert at.number_input(key="nr_num_processes").label == "Ray workers (0 or 1: one)"
    assert (f"Ray cluster {ADDRESS}: 2 node(s) · GPUs: 1 free of 2 · CPUs: 11 free of 12"
            in [c.replace("\\", "") for c in texts(at, "caption")])
    [nodes] = [d.value for d in at.dataframe if "node" in d.value.columns]
    assert list(nodes["node"]) == ["aaaaaaaaaaaa (head)", "bbbbbbbbbbbb"]
    assert ("This run needs 2 GPU(s) (2 worker(s) × 1); 1 are free now: it waits on the cluster until Ray can "
            "place it." in texts(at, "warning"))
    assert cluster == [ADDRESS]  # three reruns, one question: the answer is cached for a few seconds
    click(at, "Preview data")
    built = fakes.preview[-1]
    assert (built.launcher, built.num_processes, built.ray_gpus_per_worker, built.ray_address,
            built.ray_max_failures) == ("ray", 2, 1.0, "", 2)


def test_a_cluster_that_does_not_answer_is_a_warning_naming_it(fakes, cluster, monkeypatch):  # noqa: F811
    problem = ray_jobs.unreachable(ADDRESS, ConnectionError("Failed to connect to Ray"))
    monkeypatch.setattr(ray_jobs, "cluster_info", lambda address, timeout_s=10.0: ray_jobs.ClusterInfo(address,
                                                                                                        problem=problem))
    at = open_new_run()
    at.radio(key="nr_launcher").set_value("ray").run()
    assert not at.exception, at.exception
    [warning] = [w for w in texts(at, "warning") if "Ray cluster" in w]
    assert warning.replace("\\", "").startswith(f"The Ray cluster does not answer, so its capacity is unknown: the Ray "
                                                f"cluster at {ADDRESS} cannot be used (ConnectionError")


def test_a_ray_preset_round_trips_through_the_form(fakes, cluster, monkeypatch):  # noqa: F811
    other = "http://gpu-b:8265"
    monkeypatch.setenv("FINETUNE_STUDIO_RAY_ADDRESSES", other)
    cfg = TrainConfig(run_name="on ray", launcher="ray", ray_address=other, num_processes=3, ray_gpus_per_worker=0.5)
    presets.save_preset("on-ray", cfg)
    at = open_new_run()
    at.selectbox(key="nr_preset_choice").set_value("on-ray")
    click(at, "Load preset")
    assert at.radio(key="nr_launcher").value == "ray"
    assert at.selectbox(key="nr_ray_address").value == other
    click(at, "Preview data")
    assert fakes.preview[-1].to_dict() == cfg.to_dict()
    assert cluster[-1] == other  # the capacity shown is the chosen cluster's


def test_a_ray_preset_without_a_cluster_on_the_server_is_a_warning(fakes, no_cluster):  # noqa: F811
    at = open_new_run(nr_launcher="ray")
    assert not at.exception, at.exception
    assert any(w.startswith("This config runs on a Ray cluster, but the server has none: set `RAY_ADDRESS`")
               for w in texts(at, "warning"))


def test_the_global_batch_on_the_cluster_counts_its_workers_not_this_hosts_gpus(fakes, cluster,  # noqa: F811
                                                                                 fake_gpu_host):
    at = open_new_run(nr_launcher="ray", nr_batch_size=3)
    assert "1 data-parallel process(es): global batch 3 rows per step (batch 3 × accumulation 1 × 1)" in texts(
        at, "caption")  # num_processes 0 on Ray: one worker, though this host has two GPUs
    at.number_input(key="nr_num_processes").set_value(4).run()
    assert "4 data-parallel process(es): global batch 12 rows per step (batch 3 × accumulation 1 × 4)" in texts(
        at, "caption")


def test_without_a_cluster_of_its_own_the_form_picks_the_first_allowed_one(fakes, cluster, monkeypatch):  # noqa: F811
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setenv("FINETUNE_STUDIO_RAY_ADDRESSES", f"{ADDRESS},http://gpu-b:8265")
    at = open_new_run(nr_launcher="ray")
    picker = at.selectbox(key="nr_ray_address")
    assert picker.options == [ADDRESS, "http://gpu-b:8265"] and picker.value == ADDRESS
    assert cluster == [ADDRESS]
    click(at, "Preview data")
    assert fakes.preview[-1].ray_address == ADDRESS  # validation needs one: the server has no RAY_ADDRESS


def test_the_capacity_of_a_cluster_the_server_does_not_allow_is_not_asked(fakes, cluster):  # noqa: F811
    at = open_new_run(**{"nr_launcher": "ray", "nr_ray_address": "http://elsewhere:8265"})
    assert not at.exception, at.exception
    assert any("is not a Ray cluster this server may use" in w for w in texts(at, "warning"))
    assert cluster == []


def test_capacity_line_says_when_free_capacity_is_unknown():
    info = ray_jobs.ClusterInfo(ADDRESS, (replace(GPU_NODE, free_gpus=None), HEAD))
    assert ray_cluster.capacity_line(info) == "2 node(s) · GPUs: ? free of 2 · CPUs: 11 free of 12"


def test_the_pages_do_not_import_ray_until_a_cluster_is_asked():
    # ray takes seconds to import: a dashboard that never uses a cluster does not pay for it.
    result = run_python("import sys, ui.ray_cluster, trainer_core.launchers.ray; print('ray' in sys.modules)")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "False"


def test_a_password_in_the_cluster_address_is_never_shown(app_home, no_cluster, monkeypatch):
    """Hostile review: RAY_ADDRESS=http://admin:secret@head:8265 was printed on Settings, which viewers see, and in
    the error of a cluster that does not answer (Ray's client quotes the URL it called)."""
    secret_address = "http://admin:hunter2-secret@head.example:8265"
    monkeypatch.setenv("RAY_ADDRESS", secret_address)
    monkeypatch.setenv("FINETUNE_STUDIO_RAY_ADDRESSES", "http://ops:other-secret@head2.example:8265?token=t0k")

    def inspect_cluster(address, timeout_s=10.0):
        info = ray_jobs.ClusterInfo(address, problem=ray_jobs.unreachable(
            address, ConnectionError(f"Failed to connect to {address}/api/version")))
        return ray_jobs.ClusterCheck(info, "", (info.problem,))

    monkeypatch.setattr(ray_jobs, "inspect_cluster", inspect_cluster)
    at = settings_page()
    check_button(at).click().run()
    shown = " ".join(e.value for kind in ("markdown", "error", "caption", "info", "success")
                     for e in getattr(at, kind)) + " ".join(str(s.options) for s in at.selectbox)
    assert "head.example:8265" in shown and "head2.example:8265" in shown
    for secret in ("hunter2-secret", "admin:", "other-secret", "t0k"):
        assert secret not in shown, secret
    assert ray_jobs.shown_address(secret_address) == "http://head.example:8265"
