"""The wheel holds every package: discovery finds each folder of Python files, and a fresh install imports them all."""
from __future__ import annotations

import importlib.util
import sys

import pytest
from setuptools import find_packages

from tests.support import ROOT

_spec = importlib.util.spec_from_file_location("check_wheel", ROOT / "scripts" / "check_wheel.py")
check_wheel = importlib.util.module_from_spec(_spec)
sys.modules["check_wheel"] = check_wheel
_spec.loader.exec_module(check_wheel)


def test_every_folder_of_python_files_is_a_discovered_package():
    files = check_wheel.source_files()
    assert check_wheel.missing_inits(files) == []
    folders = {p.rsplit("/", 1)[0].replace("/", ".") for p in files
               if p.endswith(".py") and p.split("/")[0] in check_wheel.PACKAGE_ROOTS}
    found = set(find_packages(str(ROOT), include=["trainer_core*", "db*", "ui*", "gateway*"]))
    assert folders - found == set()
    assert {"trainer_core.export", "trainer_core.jobs"} <= found  # the two the hand-written list left out


def test_expected_files_map_presets_into_the_package_and_skip_bytecode():
    files = ["presets/cpu-demo.yaml", "presets/README", "trainer_core/data/demo_chat.jsonl",
             "trainer_core/export/spec.py", "trainer_core/__pycache__/x.cpython-311.pyc", "tests/test_x.py",
             "scripts/check_wheel.py"]
    assert check_wheel.expected_in_wheel(files) == {
        "trainer_core/builtin_presets/cpu-demo.yaml", "trainer_core/data/demo_chat.jsonl",
        "trainer_core/export/spec.py"}
    assert check_wheel.missing_inits(["trainer_core/__init__.py", "trainer_core/export/spec.py"]) == [
        "trainer_core/export"]
    assert check_wheel.module_names(["trainer_core/__init__.py", "trainer_core/export/spec.py",
                                     "trainer_core/data/demo_chat.jsonl", "finetune_studio-0.1.0.dist-info/RECORD"]
                                    ) == ["trainer_core", "trainer_core.export.spec"]


@pytest.mark.subprocess  # builds the wheel, a fresh venv, and imports every module there (~20 s); CI runs it too
def test_the_wheel_installs_non_editable_and_imports_every_module(capsys):
    assert check_wheel.check() == []
    assert "all import from a fresh non-editable install" in capsys.readouterr().out
