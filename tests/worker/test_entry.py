"""``python -m trainer_core.worker RUN_DIR`` runs the entry point of the job's kind (kind.txt in the run folder;
none: a training job, as every folder made before kinds existed)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.support import ROOT
from trainer_core.protocol import paths
from trainer_core.protocol.status import KIND_FILE, JobKind, read_kind, write_kind
from trainer_core.worker import ENTRY_POINTS
from trainer_core.worker.__main__ import main

ENTRY = """
from pathlib import Path
seen = []

def main(run_dir: Path) -> int:
    seen.append(run_dir)
    return 7
"""


def test_every_kind_has_an_entry_point_with_main():
    assert set(ENTRY_POINTS) == set(JobKind)
    # The modules are only named here: importing one would load the ML stack into the test process.
    for kind, module in ENTRY_POINTS.items():
        assert importlib.util.find_spec(module) is not None, kind


def test_the_kind_comes_from_the_run_folder(tmp_path):
    assert read_kind(tmp_path) is JobKind.TRAIN  # no kind.txt: a folder from before kinds
    write_kind(tmp_path, JobKind.TRAIN)
    assert (tmp_path / KIND_FILE).read_text() == "train\n" and read_kind(tmp_path) is JobKind.TRAIN
    (tmp_path / KIND_FILE).write_text("serve\n")
    assert read_kind(tmp_path) is JobKind.SERVE
    (tmp_path / KIND_FILE).write_text("<b>deploy</b>\n")
    with pytest.raises(ValueError, match=r"kind\.txt names the job kind '<b>deploy</b>'; known kinds: "
                                         r"train, serve, eval, export"):
        read_kind(tmp_path)


def test_the_worker_runs_the_entry_point_of_the_jobs_kind(home, tmp_path, monkeypatch):
    (tmp_path / "fake_entry.py").write_text(ENTRY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(ENTRY_POINTS, JobKind.TRAIN, "fake_entry")
    run_dir = paths.run_dir("20260101-120000-abc123")
    run_dir.mkdir(parents=True)
    write_kind(run_dir, JobKind.TRAIN)
    assert main(["worker", str(run_dir)]) == 7
    assert importlib.import_module("fake_entry").seen == [run_dir.resolve()]


def test_an_unknown_kind_stops_the_worker_with_a_message_in_its_log(home):
    run_dir = paths.run_dir("20260101-120000-def456")
    run_dir.mkdir(parents=True)
    (run_dir / KIND_FILE).write_text("teleport\n")
    done = subprocess.run([sys.executable, "-m", "trainer_core.worker", str(run_dir)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 2
    assert "names the job kind 'teleport'; known kinds: train" in done.stderr
