"""merge_adapter when writing fails (a full disk): nothing half-written stays next to the run. In a subprocess
(the test process never imports the ML stack); the model is a stand-in, so it takes only the imports."""
from __future__ import annotations

import json

import pytest

from tests.support import run_python

pytestmark = pytest.mark.slow

SCRIPT = r"""
import errno, json, sys
from pathlib import Path
from trainer_core.jobspec import ModelSource, ResolvedSource
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
print(json.dumps({"raised": raised, "left": sorted(p.name for p in (root / "serving").iterdir())}))
"""


def test_a_merge_that_cannot_be_written_leaves_no_half_copy(tmp_path):
    """A full disk mid-save left `.final.tmp-<pid>` (part of a model's weights) in the run's serving folder,
    one more at every retry."""
    result = run_python(SCRIPT, str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"raised": "No space left on device", "left": []}
