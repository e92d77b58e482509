"""Checkpoint discovery and safe cleanup, and the path rules they rely on (trainer_core.protocol.paths)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainer_core.protocol import paths
from trainer_core.specs.checkpoints import completed_checkpoints, latest_checkpoint, remove_partial_checkpoints
from trainer_core.protocol.paths import UnsafePathError


def make_checkpoint(folder: Path, name: str, complete: bool = True) -> Path:
    path = folder / name
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"weights")
    if complete:
        (path / "trainer_state.json").write_text("{}")
    return path


@pytest.fixture
def outputs(tmp_path):
    """(outputs root, a run's output folder inside it)."""
    root = tmp_path / "runs"
    out = root / "r1" / "outputs"
    out.mkdir(parents=True)
    return root, out


# ---------------------------------------------------------------------- discovery
def test_latest_checkpoint_is_the_highest_completed_step(outputs):
    _, out = outputs
    make_checkpoint(out, "checkpoint-9")
    make_checkpoint(out, "checkpoint-10")
    make_checkpoint(out, "checkpoint-2")
    make_checkpoint(out, "checkpoint-50", complete=False)  # saving was interrupted
    make_checkpoint(out, "tmp-checkpoint-60")
    make_checkpoint(out, "checkpoint-final")
    (out / "checkpoint-70").write_text("a file, not a folder")
    assert completed_checkpoints(out) == [out / "checkpoint-2", out / "checkpoint-9", out / "checkpoint-10"]
    assert latest_checkpoint(out) == out / "checkpoint-10"


@pytest.mark.parametrize("state", ["", '{"global_step": 12, "log_hist', "[]", b"\xff\xfe"])
def test_a_checkpoint_whose_trainer_state_was_cut_short_is_not_completed(outputs, state):
    """transformers writes trainer_state.json last, straight into the folder: a kill -9 during that write leaves
    the file empty or cut short, and resuming from it would fail (or resume the wrong step)."""
    _, out = outputs
    make_checkpoint(out, "checkpoint-4")
    torn = make_checkpoint(out, "checkpoint-12", complete=False)
    (torn / "trainer_state.json").write_bytes(state if isinstance(state, bytes) else state.encode())
    assert latest_checkpoint(out) == out / "checkpoint-4"


def test_symlinked_checkpoint_is_not_a_completed_checkpoint(outputs, tmp_path):
    _, out = outputs
    elsewhere = make_checkpoint(tmp_path / "elsewhere", "checkpoint-99")
    make_checkpoint(out, "checkpoint-3")
    (out / "checkpoint-99").symlink_to(elsewhere, target_is_directory=True)
    assert latest_checkpoint(out) == out / "checkpoint-3"


def test_no_checkpoints(outputs, tmp_path):
    _, out = outputs
    assert completed_checkpoints(out) == []
    assert latest_checkpoint(out) is None
    assert latest_checkpoint(tmp_path / "missing") is None


# ---------------------------------------------------------------------- cleanup
def test_cleanup_removes_only_partials(outputs):
    root, out = outputs
    done = make_checkpoint(out, "checkpoint-5")
    unfinished = make_checkpoint(out, "checkpoint-8", complete=False)
    tmp8 = make_checkpoint(out, "tmp-checkpoint-8", complete=False)
    tmp9 = make_checkpoint(out, "tmp-checkpoint-9")
    (tmp9 / "nested").mkdir()
    (tmp9 / "nested" / "x.bin").write_bytes(b"x")
    odd = make_checkpoint(out, "tmp-checkpoint-final")
    (out / "tmp-checkpoint-10").write_text("a file")
    (out / "adapter_config.json").write_text("{}")

    torn = make_checkpoint(out, "checkpoint-7", complete=False)
    (torn / "trainer_state.json").write_text('{"global_step": 7, "log_hi')  # killed while writing the state
    odd_unfinished = make_checkpoint(out, "checkpoint-best", complete=False)
    (out / "checkpoint-11").write_text("a file")

    removed = remove_partial_checkpoints(out, root)

    # Incomplete checkpoint-<int> folders (a save killed before trainer_state.json was whole) go like the
    # tmp-checkpoint-<int> partials: resuming never picks them, and nothing else ever removed them.
    assert sorted(removed) == sorted([tmp8.resolve(), tmp9.resolve(), unfinished.resolve(), torn.resolve()])
    assert not tmp8.exists() and not tmp9.exists() and not unfinished.exists() and not torn.exists()
    assert (done / "trainer_state.json").read_text() == "{}"
    assert (done / "adapter_model.safetensors").read_bytes() == b"weights"
    assert odd.exists() and odd_unfinished.exists()  # numeric suffixes only
    assert (out / "checkpoint-11").read_text() == "a file"
    assert (out / "tmp-checkpoint-10").read_text() == "a file"
    assert (out / "adapter_config.json").exists()
    assert remove_partial_checkpoints(out, root) == []


def test_cleanup_does_not_follow_a_symlinked_partial(outputs, tmp_path):
    root, out = outputs
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("mine")
    link = out / "tmp-checkpoint-4"
    link.symlink_to(precious, target_is_directory=True)

    assert remove_partial_checkpoints(out, root) == []
    assert (precious / "keep.txt").read_text() == "mine"
    assert link.is_symlink()


def test_cleanup_does_not_follow_a_symlinked_incomplete_checkpoint(outputs, tmp_path):
    root, out = outputs
    elsewhere = make_checkpoint(tmp_path / "elsewhere", "checkpoint-6", complete=False)
    link = out / "checkpoint-6"
    link.symlink_to(elsewhere, target_is_directory=True)

    assert remove_partial_checkpoints(out, root) == []
    assert (elsewhere / "adapter_model.safetensors").read_bytes() == b"weights"
    assert link.is_symlink()


def test_cleanup_unlinks_symlinks_inside_a_partial_without_following_them(outputs, tmp_path):
    root, out = outputs
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("mine")
    partial = make_checkpoint(out, "tmp-checkpoint-4", complete=False)
    (partial / "link").symlink_to(precious, target_is_directory=True)

    assert remove_partial_checkpoints(out, root) == [partial.resolve()]
    assert not partial.exists()
    assert (precious / "keep.txt").read_text() == "mine"


def test_cleanup_refuses_a_symlinked_output_dir(outputs, tmp_path):
    root, out = outputs
    real = root / "r2" / "outputs"
    real.mkdir(parents=True)
    partial = make_checkpoint(real, "tmp-checkpoint-1", complete=False)
    link = root / "r3-outputs"
    link.symlink_to(real, target_is_directory=True)

    with pytest.raises(UnsafePathError, match="is a symlink"):
        remove_partial_checkpoints(link, root)
    assert partial.exists()


@pytest.mark.parametrize("where", ["sibling", "dotdot", "root_parent"])
def test_cleanup_refuses_folders_outside_the_outputs_root(outputs, tmp_path, where):
    root, out = outputs
    target = {
        "sibling": tmp_path / "other",
        "dotdot": root / ".." / "other",
        "root_parent": tmp_path,
    }[where]
    (tmp_path / "other").mkdir(exist_ok=True)
    partial = make_checkpoint(tmp_path / "other", f"tmp-checkpoint-{len(where)}", complete=False)
    with pytest.raises(UnsafePathError, match="outside the outputs root"):
        remove_partial_checkpoints(target, root)
    assert partial.exists()


def test_cleanup_of_a_missing_folder_is_a_no_op(outputs):
    root, out = outputs
    assert remove_partial_checkpoints(out / "not-yet", root) == []
    assert not (out / "not-yet").exists()


def test_cleanup_of_the_root_itself_is_allowed(outputs):
    root, _ = outputs
    partial = make_checkpoint(root, "tmp-checkpoint-1", complete=False)
    assert remove_partial_checkpoints(root, root) == [partial.resolve()]


# ---------------------------------------------------------------------- paths
def test_resolve_inside_accepts_paths_under_a_root(tmp_path):
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    assert paths.resolve_inside(root / "sub" / "file.jsonl", [root]) == (root / "sub" / "file.jsonl").resolve()
    assert paths.resolve_inside(root, [root]) == root.resolve()
    assert paths.resolve_inside(root / "sub" / ".." / "x", [root]) == (root / "x").resolve()
    other = tmp_path / "other"
    assert paths.resolve_inside(other / "y", [root, other]) == (other / "y").resolve()


@pytest.mark.parametrize("escape", ["../outside.txt", "sub/../../outside.txt", "/etc/passwd"])
def test_resolve_inside_refuses_escapes(tmp_path, escape):
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    candidate = escape if escape.startswith("/") else str(root / escape)
    with pytest.raises(UnsafePathError, match="outside the allowed folders"):
        paths.resolve_inside(candidate, [root])


def test_resolve_inside_refuses_a_prefix_sibling(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    with pytest.raises(UnsafePathError):
        paths.resolve_inside(tmp_path / "data-evil" / "x", [root])


def test_resolve_inside_refuses_symlinks_out(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("s")
    (root / "link.txt").symlink_to(secret)
    (root / "linkdir").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(UnsafePathError):
        paths.resolve_inside(root / "link.txt", [root])
    with pytest.raises(UnsafePathError):
        paths.resolve_inside(root / "linkdir" / "secret.txt", [root])


def test_layout_under_the_data_root(home):
    assert paths.data_root() == home.resolve()
    assert paths.runs_dir() == home.resolve() / "runs"
    assert paths.datasets_dir() == home.resolve() / "datasets"
    assert paths.models_dir() == home.resolve() / "models"
    assert all(p.is_dir() for p in (paths.runs_dir(), paths.datasets_dir(), paths.models_dir()))
    assert paths.run_dir("abc_1-2") == home.resolve() / "runs" / "abc_1-2"


@pytest.mark.parametrize("bad_id", ["a/b", "../x", "..", ".", "", "-lead", "a b", "a\n", "x" * 65, "a\\b"])
def test_run_dir_rejects_unsafe_ids(home, bad_id):
    with pytest.raises(UnsafePathError, match="not allowed"):
        paths.run_dir(bad_id)


def test_allowed_data_roots(home, tmp_path, monkeypatch):
    assert paths.allowed_data_roots() == [home.resolve(), tmp_path]
    extra = tmp_path / "extra"
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{extra}{os.pathsep}")
    assert paths.allowed_data_roots() == [home.resolve(), extra]
    monkeypatch.delenv("FINETUNE_STUDIO_ALLOWED_ROOTS")
    # the data root alone: the working directory (often the checkout: .streamlit/, .git, the code) is not data
    assert paths.allowed_data_roots() == [home.resolve()]
