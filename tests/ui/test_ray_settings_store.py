"""Settings saves the Ray cluster (issue 23), through AppTest: an admin's form (the single-user dashboard is its
admin), field errors that name the field and the fix, a save only after the check passes (a cluster that does not
answer: a real address nobody listens on; a node that cannot see the storage: the check's answer faked), the saved
values read-only for everyone else, clearing, the environment winning over the saved path, and a database from
before the table. The real save against a local cluster is tests/launchers/test_ray_settings_save.py."""
from __future__ import annotations

import sqlite3
from dataclasses import replace
from types import SimpleNamespace

import pytest
from streamlit.testing.v1 import AppTest

from db import settings_store, users
from tests.db.test_migration import OLD_SCHEMA
from tests.support.ray_cluster import free_port
from tests.support.apptest import APP, TIMEOUT, click, fakes, open_new_run  # noqa: F401 - fakes is a fixture
from trainer_core.auth.access import Role
from trainer_core.config import TrainConfig, server_cluster
from trainer_core.launchers import ray as ray_jobs
from trainer_core.protocol import paths
from trainer_core.protocol.cluster_settings import SavedCluster
from ui import auth
from ui.state import get_orchestrator

ADDRESS = "http://head.example:8265"
HEAD = ray_jobs.RayNode("a" * 56, "10.0.0.1", True, cpus=4, gpus=0, free_cpus=4, free_gpus=0)
OTHER = ray_jobs.RayNode("b" * 56, "10.0.0.2", False, cpus=8, gpus=2, free_cpus=8, free_gpus=2)


@pytest.fixture
def page(app_home, monkeypatch):
    """Settings of a server without a cluster in its environment; the shared path is the data root's parent."""
    for name in ("RAY_ADDRESS", "FINETUNE_STUDIO_RAY_ADDRESSES", "FINETUNE_STUDIO_SHARED_STORAGE"):
        monkeypatch.delenv(name, raising=False)
    app_home.mkdir(parents=True, exist_ok=True)
    return app_home.parent


@pytest.fixture
def checked(monkeypatch):
    """The cluster check answered without a cluster: every node sees the path unless ``blind`` names one."""
    asked, blind = [], []

    def inspect(address, timeout_s=120.0, shared=None):
        asked.append((address, shared))
        nodes = tuple(replace(n, shared="FileNotFoundError: not mounted" if n in blind else "") for n in (HEAD, OTHER))
        problems = tuple(f"node {n.address} ({n.node_id[:12]}) cannot share files with this host under {shared}: its "
                         f"probe file is missing here ({n.shared})" for n in nodes if n.shared)
        return ray_jobs.ClusterCheck(ray_jobs.ClusterInfo(address, nodes), shared, problems)

    monkeypatch.setattr(ray_jobs, "inspect_cluster", inspect)
    return asked, blind


def open_settings() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("pages/settings.py").run()
    assert not at.exception, at.exception
    return at


def fill(at: AppTest, address: str, shared: str) -> AppTest:
    at.text_input(key="settings_ray_new_address").set_value(address)
    at.text_input(key="settings_ray_new_shared").set_value(shared)
    at.button(key="settings_ray_save").click().run()
    assert not at.exception, at.exception
    return at


def saved() -> SavedCluster:
    return settings_store.read_cluster(get_orchestrator().store.engine)


def errors(at: AppTest) -> list[str]:
    return [e.value.replace("\\", "") for e in at.error]


def test_an_admin_saves_the_cluster_once_the_check_passes_and_runs_may_use_it(page, checked):
    asked, _ = checked
    at = open_settings()
    assert "Nothing saved: the server's environment alone says where runs may go." in [c.value for c in at.caption]
    fill(at, ADDRESS + "/", str(page))
    assert asked == [(ADDRESS, str(page))]  # the entered path is probed, before anything is saved
    assert (saved().address, saved().shared_storage, saved().saved_by) == (ADDRESS, str(page), auth.current_actor().name)
    assert f"Saved: runs may use {ADDRESS}, with run folders under {page}." in [s.value.replace("\\", "") for s in at.success]
    [shown] = [m.value for m in at.markdown if m.value.startswith("Cluster address")]
    assert shown == (f"Cluster address: not set (`RAY_ADDRESS`)  \nSaved in Settings, the server's cluster (runs "
                     f"without a cluster of their own, and eval, export and serve jobs on Ray, go there): `{ADDRESS}`"
                     f"  \nShared storage: `{page}` (saved in Settings; `FINETUNE_STUDIO_SHARED_STORAGE` is not set)")
    assert ray_jobs.server_addresses() == [ADDRESS]
    assert ray_jobs.shared_storage_problem(paths.runs_dir()) == ""
    # with RAY_ADDRESS unset, the saved cluster is the server's: a run naming none, and jobs on Ray, go there
    assert server_cluster() == ADDRESS
    assert [e for e in TrainConfig(launcher="ray").validate() if e.field in ("ray_address", "launcher")] == []
    assert ray_jobs.spec_problems(SimpleNamespace(launcher="ray", gpu_ids=[])) == []
    assert [b.label for b in at.button if b.key == "settings_ray_check_button"] == ["Check cluster"]


def test_a_cluster_that_does_not_answer_saves_nothing_and_says_which_check_failed(page):
    nobody = f"http://127.0.0.1:{free_port()}"  # a real address nobody listens on: the real check, failing
    at = fill(open_settings(), nobody, str(page))
    assert saved() == SavedCluster()
    found = errors(at)
    assert found[0] == "Nothing was saved: the cluster check failed (it does not answer)."
    assert found[1].startswith(f"the Ray cluster at {nobody} cannot be used (")
    assert not [s for s in at.success if s.value.startswith("Saved")]


def test_a_node_that_cannot_see_the_storage_is_named_and_nothing_is_saved(page, checked):
    _, blind = checked
    blind.append(OTHER)
    at = fill(open_settings(), ADDRESS, str(page))
    assert saved() == SavedCluster()
    assert errors(at) == [
        f"Nothing was saved: the shared-storage check failed: 1 of 2 node(s) cannot see {page}.",
        f"node 10.0.0.2 (bbbbbbbbbbbb) cannot share files with this host under {page}: its probe file is missing here "
        "(FileNotFoundError: not mounted)"]
    [table] = [d.value for d in at.dataframe if "shared storage" in d.value.columns]
    assert list(table["shared storage"]) == ["sees it", "cannot see it: FileNotFoundError: not mounted"]


@pytest.mark.parametrize("address, shared, expected", [
    ("http://ann:s3cret@head:8265", None, ["Cluster address: remove the user and password: Settings are stored in the "
                                           "database, which never holds a secret. Enter the address without them "
                                           "(http://head:8265), or keep an address that needs them in the server's "
                                           "environment (RAY_ADDRESS)"]),
    ("ray://head:10001", None, ["Cluster address: use the dashboard's http:// or https:// address, e.g. http://head:8265 "
                                "(not 'ray://head:10001': ray:// and the head's GCS port 6379 are not the Jobs API)"]),
    ("http://head:99999", None, ["Cluster address: the port must be a number from 1 to 65535, e.g. http://head:8265"]),
    ("http://head:8265/?x=1", None, ["Cluster address: remove the ?query and #fragment: the address is the dashboard's "
                                     "base URL, e.g. http://head:8265"]),
    ("http://he\x00ad:8265", None, ["Cluster address: remove the spaces and control characters: an address is one "
                                    "word, e.g. http://head:8265"]),
    ("http://head\uff1a8265", None, ["Cluster address: not an address that can be read (netloc 'head\uff1a8265' "
                                     "contains invalid characters under NFKC normalization): enter the dashboard's "
                                     "address, e.g. http://head:8265"]),
    ("http://[::1", None, ["Cluster address: not an address that can be read (Invalid IPv6 URL): enter the "
                           "dashboard's address, e.g. http://head:8265"]),
    ("http://" + "h" * 600, None, ["Cluster address: at most 500 characters (got 607): enter the dashboard's address, "
                                   "e.g. http://head:8265"]),
    ("", "", ["Cluster address: enter the cluster's dashboard address (Ray Jobs), e.g. http://head:8265",
              "Shared storage path: enter the path every node of the cluster mounts, e.g. /mnt/shared"]),
    (ADDRESS, "shared", ["Shared storage path: use an absolute path (every node mounts the storage at the same path), "
                         "e.g. /mnt/shared, not 'shared'"]),
    (ADDRESS, "/nonexistent/share", ["Shared storage path: /nonexistent/share is not a folder on this host: mount the "
                                     "shared storage here at the same path as on the nodes (the dashboard reads the "
                                     "run folders there), then save"]),
    (ADDRESS, "/x" * 3000, ["Shared storage path: at most 4096 characters (got 6000): enter the mount point, e.g. "
                            "/mnt/shared"]),
    (ADDRESS, "/mnt/\x00", ["Shared storage path: remove the control characters: enter the mount point, e.g. /mnt/shared"]),
])
def test_bad_fields_are_named_with_their_fix_and_nothing_is_asked_or_saved(page, checked, address, shared, expected):
    asked, _ = checked
    at = fill(open_settings(), address, str(page) if shared is None else shared)
    assert errors(at) == [*expected, "Nothing was saved: fix the fields above."]
    assert asked == [] and saved() == SavedCluster()


def test_a_shared_path_that_does_not_hold_the_data_root_names_that_requirement(page, checked, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    at = fill(open_settings(), ADDRESS, str(tmp_path / "elsewhere"))
    [error, _] = errors(at)
    assert error == (f"Shared storage path: the data root {paths.data_root().resolve()} (FINETUNE_STUDIO_HOME) is not "
                     f"under {tmp_path / 'elsewhere'}: run folders live in the data root and the cluster's nodes see "
                     "only the shared storage, so the data root must be inside it. Enter the mount point that holds "
                     "the data root, or restart the dashboard with FINETUNE_STUDIO_HOME under "
                     f"{tmp_path / 'elsewhere'}")
    assert checked[0] == [] and saved() == SavedCluster()


@pytest.mark.parametrize("name, role", [("val", Role.VIEWER), ("ann", Role.OPERATOR)])
def test_everyone_but_admins_sees_the_saved_cluster_read_only(page, monkeypatch, name, role):
    store = get_orchestrator().store
    users.ensure_user(store, name, role)
    settings_store.save_cluster(store, ADDRESS, str(page), "ada")
    monkeypatch.setenv(auth.SHARED_ENV, "1")  # as tests/test_access.py: nginx's headers, without nginx
    monkeypatch.setattr(auth, "proxy_user", lambda: name)
    monkeypatch.setattr(auth, "proxy_session", lambda: users.get_user(store, name).session_generation)
    at = open_settings()
    assert "Only an admin can save or clear the Ray cluster." in [i.value for i in at.info]
    assert not [t for t in at.text_input if t.key.startswith("settings_ray_new")]
    assert not [b for b in at.button if b.key in ("settings_ray_save", "settings_ray_clear")]
    [shown] = [m.value for m in at.markdown if m.value.startswith("Address:")]
    assert shown.startswith(f"Address: `{ADDRESS}`  \nShared storage: `{page}`  \nSaved by ada on ")


def test_a_crafted_save_by_a_non_admin_is_refused(page, checked):
    from ui.ray_settings import save

    store = get_orchestrator().store
    outcome = save(store, auth.Actor("ann", Role.OPERATOR), ADDRESS, str(page))
    assert outcome.refused == "Only an admin can save the Ray cluster; ann's role is operator."
    assert checked[0] == [] and saved() == SavedCluster()


def test_an_admin_clears_the_saved_cluster(page, checked):
    settings_store.save_cluster(get_orchestrator().store, ADDRESS, str(page), "ada")
    at = open_settings()
    assert at.text_input(key="settings_ray_new_address").value == ADDRESS  # the form starts from what is saved
    at.button(key="settings_ray_clear").click().run()
    assert not at.exception, at.exception
    assert saved() == SavedCluster() and ray_jobs.server_addresses() == []
    assert at.button(key="settings_ray_clear").disabled


def test_the_environment_wins_over_the_saved_path_and_the_page_says_so(page, checked, monkeypatch, tmp_path):
    settings_store.save_cluster(get_orchestrator().store, ADDRESS, str(page), "ada")
    monkeypatch.setenv("RAY_ADDRESS", "http://own:8265")
    monkeypatch.setenv("FINETUNE_STUDIO_SHARED_STORAGE", str(tmp_path / "env-share"))
    at = open_settings()
    [shown] = [m.value for m in at.markdown if m.value.startswith("Cluster address")]
    assert shown == ("Cluster address: `http://own:8265` (`RAY_ADDRESS`)  \nSaved in Settings, also allowed for runs: "
                     f"`{ADDRESS}`  \nShared storage: `{tmp_path / 'env-share'}` (`FINETUNE_STUDIO_SHARED_STORAGE`), "
                     f"in force: the saved `{page}` applies only while it is unset")
    assert at.selectbox(key="settings_ray_address").options == ["http://own:8265", ADDRESS]


def test_a_database_from_before_the_settings_table_still_opens_the_page(page, checked):
    paths.data_root().mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(paths.data_root() / "studio.db") as conn:
        conn.executescript(OLD_SCHEMA)
    at = open_settings()
    assert "Nothing saved: the server's environment alone says where runs may go." in [c.value for c in at.caption]
    fill(at, ADDRESS, str(page))
    assert saved().address == ADDRESS


def test_new_run_offers_the_saved_cluster_and_builds_a_run_on_it(fakes, page, monkeypatch):  # noqa: F811
    monkeypatch.setattr(ray_jobs, "cluster_info", lambda address, timeout_s=10.0: ray_jobs.ClusterInfo(address, (HEAD,)))
    settings_store.save_cluster(get_orchestrator().store, ADDRESS, str(page), "ada")
    at = open_new_run()
    at.radio(key="nr_launcher").set_value("ray").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="nr_ray_address").options == [ADDRESS]  # no cluster in the environment: the saved one
    click(at, "Preview data")
    built = fakes.preview[-1]
    assert (built.launcher, built.ray_address) == ("ray", ADDRESS)
    assert [e for e in built.validate() if e.field in ("ray_address", "launcher")] == []


def test_the_saved_cluster_is_kept_while_runs_on_it_are_not_over(page, checked, monkeypatch):
    """A run on the saved cluster is followed and stopped there only while the server may use that address (the
    launcher re-checks a run's recorded address when it adopts it): clearing or replacing it under a live run would
    leave the job running on the cluster with nobody able to stop it, and the run marked failed after a restart."""
    import time

    from db.entities import RunRecord
    from db.store import Store
    from trainer_core.protocol.status import RunStatus
    from ui.ray_settings import clear, save

    store = Store()
    admin = auth.Actor("ada", Role.ADMIN)
    settings_store.save_cluster(store, ADDRESS, str(page), "ada")
    run_dir = paths.run_dir("20260301-000000-aaaaaa")
    run_dir.mkdir(parents=True)
    (run_dir / ray_jobs.JOB_FILE).write_text(f'{{"address": "{ADDRESS}", "job_id": "finetune-studio-x"}}\n')
    store.create_run(RunRecord(id=run_dir.name, name="big run", status=RunStatus.RUNNING, created_at=time.time(),
                               output_dir=str(run_dir)))
    held = ("1 run on the saved cluster http://head.example:8265 is not over ('big run'): the dashboard follows and "
            "stops a run there only while it may use that cluster. Stop it or wait until it ends, then change the "
            "saved cluster (or allow the address in the server's FINETUNE_STUDIO_RAY_ADDRESSES)")
    assert clear(store, admin).refused == held
    assert save(store, admin, "http://other.example:8265", str(page)).refused == held
    assert settings_store.read_cluster(store.engine).address == ADDRESS and checked[0] == []
    assert save(store, admin, ADDRESS, str(page)).saved is not None  # the same cluster, checked again: kept
    monkeypatch.setenv("FINETUNE_STUDIO_RAY_ADDRESSES", ADDRESS)  # the environment allows it anyway
    assert clear(store, admin) == "cleared" and settings_store.read_cluster(store.engine) == SavedCluster()
    assert clear(store, auth.Actor("ann", Role.OPERATOR)).refused.startswith("Only an admin can")
