"""Server paths by role (issue 31, item 9): an admin reads absolute paths; an operator or a viewer reads a path under
a named root as "datasets/x.jsonl in the data root" and the allowed roots by name, on the Settings page and in the
error messages the pages show. The CLI (the local admin) keeps absolute paths."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_access import _as_user, shared_store  # noqa: F401 - shared_store: a fixture used below
from tests.support.apptest import open_page, texts, use_local_file
from trainer_core.auth.access import Actor, Role
from trainer_core.config import TrainConfig
from trainer_core.protocol import paths
from ui.server_paths import for_actor, relative


def test_a_path_under_a_named_root_is_shown_relative_to_it_and_each_root_by_its_name(tmp_path):
    data, corpora = tmp_path / "home", tmp_path / "corpora"
    roots = [(data, "the data root"), (corpora, 'the allowed folder "corpora"')]
    message = f"x.jsonl resolves to {data}/datasets/x.jsonl, which is outside the allowed folders ({data}, {corpora})."
    assert relative(message, roots) == ("x.jsonl resolves to datasets/x.jsonl in the data root, which is outside the "
                                        'allowed folders (the data root, the allowed folder "corpora").')
    assert relative(f"'{corpora}/a.txt' and {data}work/x", roots) == (
        f"'a.txt in the allowed folder \"corpora\"' and {data}work/x")  # a longer name is another folder


def test_only_an_admin_reads_the_absolute_paths_of_a_message(home, tmp_path):
    message = f"{paths.datasets_dir() / 'x.jsonl'} does not exist"
    assert for_actor(message, Actor("ada", Role.ADMIN)) == message
    for role in (Role.OPERATOR, Role.VIEWER):
        assert for_actor(message, Actor("ann", role)) == "datasets/x.jsonl in the data root does not exist"


@pytest.mark.parametrize("name, absolute", [("ann", False), ("val", False), ("ada", True)])
def test_the_settings_page_shows_server_paths_to_admins_only(shared_store, monkeypatch, tmp_path, name, absolute):
    _as_user(monkeypatch, name)
    at = open_page("pages/settings.py")
    shown = "\n".join(m.value for m in at.markdown)
    assert (str(paths.data_root()) in shown) is absolute, shown
    assert (str(tmp_path) in shown) is absolute
    if not absolute:
        assert "Data folder: the data root" in shown


@pytest.mark.parametrize("name, absolute", [("ann", False), ("ada", True)])
def test_new_run_names_the_allowed_roots_instead_of_their_paths_to_non_admins(shared_store, monkeypatch, tmp_path,
                                                                              name, absolute):
    _as_user(monkeypatch, name)
    at = use_local_file(open_page("pages/new_run.py"), Path("/etc/hosts"))
    errors = [e for e in texts(at, "error") if "outside the allowed folders" in e]
    assert errors, texts(at, "error")
    assert all((str(tmp_path) in e) is absolute for e in errors), errors
    if not absolute:
        assert any("the data root" in e for e in errors), errors


@pytest.mark.parametrize("name, absolute", [("ann", False), ("ada", True)])
def test_run_details_show_a_failed_runs_error_and_log_with_server_paths_to_admins_only(shared_store, monkeypatch,
                                                                                      name, absolute):
    import time

    from db.entities import RunRecord
    from trainer_core.protocol.status import RunStatus

    where = paths.datasets_dir() / "secret-layout" / "x.jsonl"
    shared_store.create_run(RunRecord(id="20250101-000000-failed", name="failed run", owner="ann",
                                      status=RunStatus.FAILED.value, created_at=time.time(), finished_at=time.time(),
                                      error=f"DatasetError: {where} does not exist",
                                      log_tail=f"Traceback ...\nFileNotFoundError: {where}"))
    paths.run_dir("20250101-000000-failed").mkdir(parents=True, exist_ok=True)
    _as_user(monkeypatch, name)
    at = open_page("pages/run.py", query={"run": "20250101-000000-failed"})
    error = next(e.value for e in at.error if "DatasetError" in e.value)
    log = next(c.value for c in at.code if "FileNotFoundError" in c.value)
    assert (str(paths.data_root()) in error) is absolute and (str(paths.data_root()) in log) is absolute
    if not absolute:
        assert "datasets/secret-layout/x.jsonl in the data root" in error and "in the data root" in log
