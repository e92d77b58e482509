"""Settings saves a real cluster: against a one-node local Ray cluster (tests/support/ray_cluster.py), "Check and save"
runs the real check (the cluster answers, the probe job writes and reads a file under the shared path on the node) and
stores the address and path; the saved address then validates as a ``launcher: ray`` run's ray_address on a server
whose environment names no cluster, and the saved path is the shared storage in force."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from db import settings_store
from tests.support.apptest import APP
from trainer_core.config import TrainConfig
from trainer_core.launchers import ray as ray_jobs
from trainer_core.protocol import paths
from ui.state import get_orchestrator

pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
pytestmark = [pytest.mark.ray]


def test_save_against_a_real_cluster_stores_it_and_a_run_may_name_it(app_home, monkeypatch):
    from tests.support.ray_cluster import local_cluster

    for name in ("RAY_ADDRESS", "FINETUNE_STUDIO_RAY_ADDRESSES", "FINETUNE_STUDIO_SHARED_STORAGE"):
        monkeypatch.delenv(name, raising=False)
    shared = app_home.parent  # the data root is under it, as Settings requires
    app_home.mkdir(parents=True, exist_ok=True)
    with local_cluster(cpus_per_node=1, nodes=1) as cluster:
        at = AppTest.from_file(APP, default_timeout=180).run()
        at.switch_page("pages/settings.py").run()
        assert [e for e in TrainConfig(launcher="ray", ray_address=cluster.address).validate()
                if e.field == "ray_address"]  # not allowed before it is saved
        at.text_input(key="settings_ray_new_address").set_value(cluster.address)
        at.text_input(key="settings_ray_new_shared").set_value(str(shared))
        at.button(key="settings_ray_save").click().run()
        assert not at.exception, at.exception
        assert [e.value for e in at.error] == []
        assert f"Every node sees the shared storage {shared}: run folders there work on the cluster." in [
            s.value.replace("\\", "") for s in at.success]
        [table] = [d.value for d in at.dataframe if "shared storage" in d.value.columns]
        assert list(table["shared storage"]) == ["sees it"]
        saved = settings_store.read_cluster(get_orchestrator().store.engine)
        assert (saved.address, saved.shared_storage) == (cluster.address, str(shared))
        assert not [p for p in shared.iterdir() if p.name.startswith(".ray-probe-")]  # the probe cleaned up
    assert [e for e in TrainConfig(launcher="ray", ray_address=cluster.address).validate()
            if e.field == "ray_address"] == []
    assert ray_jobs.server_addresses() == [cluster.address]
    assert ray_jobs.shared_storage() == (str(shared), "Settings")
    assert ray_jobs.shared_storage_problem(paths.runs_dir()) == ""
