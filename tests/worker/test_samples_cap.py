"""The sampling callback of a run whose prompt set grew after the run was checked (in a subprocess: the test
process never imports the ML stack; no model is loaded)."""
from __future__ import annotations

import json

import pytest

from tests.support import run_python

pytestmark = pytest.mark.subprocess

SCRIPT = r"""
import json, os, sys
from types import SimpleNamespace
from trainer_core.config import promptsets
from trainer_core.config import SAMPLE_PROMPTS_MAX, TrainConfig
from trainer_core.worker import samples

promptsets.save("grown", [f"question {i}?" for i in range(40)])  # 5 when the run was checked; added to since
warnings = []
worker = SimpleNamespace(rank=0, warn=warnings.append, log=print, events=SimpleNamespace(emit=print),
                         distributed=False, requested=lambda: None)
samples.Sampler.__init__ = lambda self, prompts, *a: setattr(self, "prompts", prompts)  # no tokenizer needed
callback = samples.make_callback(TrainConfig(sample_prompt_set="grown", sample_every_steps=5), None, True,
                                 False, False, worker)
print(json.dumps({"prompts": len(callback.sampler.prompts), "max": SAMPLE_PROMPTS_MAX, "warnings": warnings}))
"""


def test_a_prompt_set_grown_after_the_run_was_checked_is_cut_to_the_limit_with_a_warning(tmp_path):
    """Every prompt is generated at every sampling step: 40 of them slowed training with no word."""
    result = run_python(SCRIPT, env={"FINETUNE_STUDIO_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["prompts"] == out["max"]
    assert out["warnings"] == [f"The prompt set 'grown' now has 40 prompts: samples use the first {out['max']} "
                               "(each is generated at every sampling step)."]
