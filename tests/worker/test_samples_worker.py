"""The worker's sampler on the tiny model, in a subprocess (this test process never imports torch): prompts
rendered exactly as training renders them, the model and the random stream left as they were, once per
step, and a time limit or a failure reported without stopping training."""
from __future__ import annotations

import json

import pytest

from tests.support import run_python

pytestmark = pytest.mark.subprocess

SCRIPT = r"""
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trainer_core.config import TrainConfig
from trainer_core.worker import samples, token_cache

tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
model.train()
cfg = TrainConfig(system_prompt="Be brief.", sample_max_new_tokens=5)
messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
result = {
    "chat_same": samples.render(tok, "Hi?", cfg.system_prompt, True)
                 == token_cache._chat_ids(tok, messages, add_generation_prompt=True),
    "text_same": samples.render(tok, "Once upon", "", False) == list(tok(text="Once upon")["input_ids"]),
}
events, warnings = [], []
sampler = samples.Sampler(("Hi?", "Say <b>yo</b>"), tok, cfg, True, events.append, warnings.append, lambda m: None)
torch.manual_seed(7)
state = torch.get_rng_state()
sampler.take(model, 3)
sampler.take(model, 3)  # the same step twice (a save and the end at one step): answered once
result["rng_kept"] = torch.equal(state, torch.get_rng_state())
result["training"] = model.training
result["events"] = [(e.step, e.index, e.prompt, e.new_tokens, e.flags == samples.samples_check.check(e.text))
                    for e in events]
again = []
samples.Sampler(("Hi?", "Say <b>yo</b>"), tok, cfg, True, again.append, warnings.append, lambda m: None).take(model, 3)
result["greedy_repeats"] = [e.text for e in again] == [e.text for e in events]

samples.BUDGET_S = 0.0  # a time limit already spent: nothing answered, and it is said
late = []
samples.Sampler(("Hi?",), tok, cfg, True, late.append, warnings.append, lambda m: None).take(model, 4)
result["late_events"] = len(late)

def broken(**kwargs):
    raise RuntimeError("generation blew up")

samples.BUDGET_S = 60.0
failing = samples.Sampler(("Hi?",), tok, cfg, True, late.append, warnings.append, lambda m: None)
model.generate = broken
failing.take(model, 5)
failing.take(model, 6)  # off for the rest of the run: one warning, not one per step
result["training_after_failure"] = model.training
result["warnings"] = warnings
print(json.dumps(result))
"""


def test_the_sampler_renders_like_training_and_leaves_the_run_as_it_was(tiny_model):
    done = run_python(SCRIPT, str(tiny_model))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["chat_same"] and result["text_same"]
    assert result["rng_kept"] and result["training"] and result["training_after_failure"]
    assert [e[:3] for e in result["events"]] == [[3, 0, "Hi?"], [3, 1, "Say <b>yo</b>"]]
    assert all(0 <= e[3] <= 5 and e[4] for e in result["events"])
    assert result["greedy_repeats"]
    assert result["late_events"] == 0
    assert result["warnings"] == [
        "Samples at step 4 reached their time limit of 0 s: 0 of 1 answers are complete (the rest are cut short or "
        "missing). Lower sample_max_new_tokens or use fewer sample prompts.",
        "Samples at step 5 failed (RuntimeError: generation blew up); training goes on without samples."]
