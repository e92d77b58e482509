"""merge_adapter when writing fails (a full disk): nothing half-written stays next to the run. In a subprocess
(the test process never imports the ML stack); the model is a stand-in, so it takes only the imports."""
from __future__ import annotations

import json

import pytest

from tests.support import run_python

pytestmark = pytest.mark.subprocess

SCRIPT = r"""
import errno, json, sys
from pathlib import Path
from trainer_core.specs.model_source import ModelSource, ResolvedSource
from trainer_core.worker import sources

root = Path(sys.argv[1])
adapter = root / "adapter"
adapter.mkdir()
(adapter / "adapter_config.json").write_text("{}")

class Model:
    def merge_and_unload(self):
        return self
    def to(self, dtype):
        return self
    def save_pretrained(self, folder, **kwargs):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model-00001.safetensors").write_bytes(b"half" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

sources.load_source = lambda resolved, device="cpu", log=print: (Model(), object())
resolved = ResolvedSource(ModelSource(run_id="r"), "r", "base", adapter_dir=adapter)
try:
    sources.merge_adapter(resolved, root / "serving" / "final", "float32", log=lambda m: None)
    raised = ""
except OSError as exc:
    raised = exc.strerror
print(json.dumps({"raised": raised, "left": sorted(p.name for p in (root / "serving").iterdir()
                                                  if not p.name.endswith(".lock"))}))
"""


def test_a_merge_that_cannot_be_written_leaves_no_half_copy(tmp_path):
    """A full disk mid-save left `.final.tmp-<pid>` (part of a model's weights) in the run's serving folder,
    one more at every retry."""
    result = run_python(SCRIPT, str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"raised": "No space left on device", "left": []}


RACE = r"""
import sys, time
from pathlib import Path
from trainer_core.specs.model_source import ModelSource, ResolvedSource
from trainer_core.worker import sources

root, me = Path(sys.argv[1]), sys.argv[2]
adapter = root / "adapter"

class Model:
    def merge_and_unload(self):
        return self
    def to(self, dtype):
        return self
    def save_pretrained(self, folder, **kwargs):
        (root / f"saving-{me}").write_text("")
        while not (root / "go").exists():  # the test lets the first merge finish once the second has started
            time.sleep(0.02)
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model.safetensors").write_text(me)

class Tokenizer:
    def save_pretrained(self, folder):
        pass

def load(resolved, device="cpu", log=print):
    with open(root / "loads", "a") as fh:
        fh.write(me + "\n")
    return Model(), Tokenizer()

sources.load_source = load
resolved = ResolvedSource(ModelSource(run_id="r"), "r", "base", adapter_dir=adapter)
sources.merge_adapter(resolved, root / "serving" / "final", "float32", log=lambda m: None)
print((root / "serving" / "final" / "model.safetensors").read_text())
"""


def test_two_jobs_merging_the_same_adapter_merge_it_once(tmp_path):
    """Two servers (or a server and an export) merging one adapter at once: the second waited for nothing and
    replaced the folder the first had just finished and was loading from. Now it waits and reuses it."""
    import subprocess
    import sys

    from tests.support import ROOT, wait_until

    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    command = [sys.executable, "-c", RACE, str(tmp_path)]
    first = subprocess.Popen([*command, "first"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (tmp_path / "saving-first").exists(), timeout=120, what="the first merge to be saving")
        second = subprocess.Popen([*command, "second"], cwd=ROOT, stdout=subprocess.PIPE, text=True)

        def second_waits_or_loads() -> bool:  # /proc/locks marks a process waiting for a lock with "->"
            waiting = any("->" in line and f" {second.pid} " in line for line in open("/proc/locks"))
            loads = (tmp_path / "loads").read_text().split()
            return waiting or "second" in loads
        wait_until(second_waits_or_loads, timeout=120, what="the second merge to wait for the first (or load)")
        (tmp_path / "go").write_text("")
        outputs = [first.communicate(timeout=120)[0], second.communicate(timeout=120)[0]]
    finally:
        first.kill()
    assert (tmp_path / "loads").read_text().split() == ["first"]  # merged once; the second reused it
    assert [o.strip() for o in outputs] == ["first", "first"]
