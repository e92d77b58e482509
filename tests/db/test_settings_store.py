"""The saved Ray cluster (db/settings_store.py): stored, read and cleared on SQLite and PostgreSQL, added to a database
from before the table, kept by ``db rebuild``, and in force for this process once its store opens the database:
the saved address is allowed for runs beside the environment's, the saved shared path counts where the
environment's is read, and the environment wins when both are set."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from db import settings_store
from db.store import Store
from tests.db.test_migration import OLD_SCHEMA
from trainer_core.config import TrainConfig, ray_address_problem
from trainer_core.jobs import rebuild
from trainer_core.launchers import ray as ray_jobs
from trainer_core.protocol import cluster_settings, paths
from trainer_core.protocol.cluster_settings import SavedCluster

ADDRESS = "http://head.example:8265"


@pytest.fixture
def no_ray_env(monkeypatch):
    for name in ("RAY_ADDRESS", "FINETUNE_STUDIO_RAY_ADDRESSES", "FINETUNE_STUDIO_SHARED_STORAGE"):
        monkeypatch.delenv(name, raising=False)


def test_saved_cluster_is_stored_replaced_and_cleared(store):
    assert settings_store.read_cluster(store.engine) == SavedCluster()
    first = settings_store.save_cluster(store, ADDRESS, "/mnt/shared", "ada")
    assert settings_store.read_cluster(store.engine) == first
    assert (first.address, first.shared_storage, first.saved_by) == (ADDRESS, "/mnt/shared", "ada")
    second = settings_store.save_cluster(store, "http://gpu-b:8265", "/srv/share", "bob")
    assert settings_store.read_cluster(store.engine) == second  # one row per key, replaced
    assert second.saved_at >= first.saved_at
    assert settings_store.clear_cluster(store) is True
    assert settings_store.read_cluster(store.engine) == SavedCluster()
    assert settings_store.clear_cluster(store) is False


def test_a_database_from_before_the_table_gets_it_empty_and_keeps_its_runs(tmp_path):
    path = tmp_path / "studio.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD_SCHEMA)
    assert settings_store.read_settings(f"sqlite:///{path}") == []  # read before the migration: nothing saved
    store = Store(f"sqlite:///{path}")
    try:
        assert settings_store.read_cluster(store.engine) == SavedCluster()
        assert store.get_run("20260101-120000-abc123").name == "old run"
        settings_store.save_cluster(store, ADDRESS, "/mnt/shared", "ada")
        assert settings_store.read_cluster(store.engine).address == ADDRESS
    finally:
        store.engine.dispose()


def test_rebuild_keeps_the_saved_cluster(home, no_ray_env):
    store = Store()
    settings_store.save_cluster(store, ADDRESS, str(home.parent), "ada")
    store.engine.dispose()
    report = rebuild.rebuild()
    assert report.moved_aside  # the old file was set aside: the rows come from it
    fresh = Store()
    try:
        saved = settings_store.read_cluster(fresh.engine)
        assert (saved.address, saved.shared_storage, saved.saved_by) == (ADDRESS, str(home.parent), "ada")
    finally:
        fresh.engine.dispose()


def test_the_saved_cluster_is_allowed_for_runs_and_its_path_counts_until_the_environment_says_otherwise(
        home, no_ray_env, monkeypatch, tmp_path):
    store = Store()  # this process's database: its saved cluster is the one in force
    try:
        assert ray_address_problem(ADDRESS) != "" and ray_jobs.server_addresses() == []
        assert ray_jobs.shared_storage() == ("", "")
        settings_store.save_cluster(store, ADDRESS, str(tmp_path), "ada")
        assert ray_address_problem(ADDRESS) == "" and ray_address_problem(ADDRESS + "/") == ""
        assert ray_address_problem("http://other:8265") != ""
        assert [e for e in TrainConfig(launcher="ray", ray_address=ADDRESS).validate() if e.field == "ray_address"] == []
        assert ray_jobs.server_addresses() == [ADDRESS]
        monkeypatch.setenv("RAY_ADDRESS", "http://own:8265")
        assert ray_jobs.server_addresses() == ["http://own:8265", ADDRESS]  # the environment's first
        assert ray_jobs.shared_storage() == (str(tmp_path), "Settings")
        assert ray_jobs.shared_storage_problem(paths.runs_dir()) == ""  # the data root is under the saved path
        env = ray_jobs.RayLauncher(ADDRESS).environment(paths.run_dir("r1"), 1, 0.0)
        assert env["FINETUNE_STUDIO_SHARED_STORAGE"] == str(tmp_path)  # the job's own checks see the path in force
        elsewhere = tmp_path / "elsewhere"
        monkeypatch.setenv("FINETUNE_STUDIO_SHARED_STORAGE", str(elsewhere))
        assert ray_jobs.shared_storage() == (str(elsewhere), "FINETUNE_STUDIO_SHARED_STORAGE")  # the environment wins
        assert "is not under the shared storage" in ray_jobs.shared_storage_problem(paths.runs_dir())
        settings_store.clear_cluster(store)
        assert ray_address_problem(ADDRESS) != ""
    finally:
        store.engine.dispose()


def test_only_this_processs_database_counts(home, no_ray_env, monkeypatch, tmp_path):
    other = Store(f"sqlite:///{tmp_path}/other.db")  # not the data root's database: not registered
    mine = Store()
    try:
        settings_store.save_cluster(other, ADDRESS, str(tmp_path), "ada")
        assert cluster_settings.saved() == SavedCluster()
        settings_store.save_cluster(mine, ADDRESS, str(tmp_path), "ada")
        assert cluster_settings.saved().address == ADDRESS
        monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(tmp_path / "another-home"))  # another data root: not read
        assert cluster_settings.saved() == SavedCluster()
        assert not Path(tmp_path / "another-home" / "studio.db").exists()  # and nothing was created there
    finally:
        other.engine.dispose()
        mine.engine.dispose()
