"""Preference and RL methods learn what their data asks for (issue 19), measured through the studio's own
surfaces: the built-in demo presets (dpo-demo, grpo-demo) started by the orchestrator, their stored metrics and
their stored samples.

* DPO on the bundled pairs, whose chosen answers start "Studio here!": after training, the run's greedy answers
  to questions it never saw start with the marker (its samples, rendered with the chat template as the pairs were
  trained); the base model's answers to the same questions do not.
* GRPO with a length reward on the bundled model (a random tiny model never stops early, so it cannot learn
  to be short in a few steps): the mean reward of the last steps is well above that of the first steps."""
from __future__ import annotations

import json

import pytest

from tests.support import ROOT, bundled_model_folder, run_python
from trainer_core.config import presets
from trainer_core.protocol.status import RunStatus

pytestmark = pytest.mark.train

MARKER = "Studio here!"
UNSEEN = ["How many legs does a spider have?", "How many arms does an octopus have?"]

BASE_GREEDY = """
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1]); model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
out = []
for q in json.loads(sys.argv[2]):
    ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)
    gen = model.generate(**ids, max_new_tokens=12, do_sample=False)
    out.append(tok.decode(gen[0][ids["input_ids"].shape[1]:], skip_special_tokens=True))
print(json.dumps(out))
"""


def test_dpo_teaches_the_chosen_answers_marker_to_unseen_questions(studio):
    cfg = presets.load_preset("dpo-demo")  # the built-in DPO demo, as a user starts it
    pairs = (ROOT / "trainer_core/data/demo_pairs.jsonl").read_text()
    assert cfg.sample_prompts == UNSEEN and not any(word in pairs for word in ("spider", "octopus"))  # unseen
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=900)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 80)}"

    frame = studio.metrics(run_id, keys=["rewards/accuracies", "rewards/margins"])
    margins = frame.dropna(subset=["rewards/margins"])["rewards/margins"].tolist()
    assert len(margins) == cfg.max_steps and sum(margins[-4:]) / 4 > sum(margins[:4]) / 4  # the margin grew
    final = max(s.step for s in studio.samples(run_id))
    answers = {s.prompt: s.text for s in studio.samples(run_id) if s.step == final}
    assert sorted(answers) == sorted(UNSEEN)
    assert all(a.lstrip().startswith(MARKER) for a in answers.values()), answers

    base = run_python(BASE_GREEDY, str(bundled_model_folder()), json.dumps(UNSEEN))
    assert base.returncode == 0, base.stderr[-2000:]
    assert not any(MARKER in a for a in json.loads(base.stdout.strip().splitlines()[-1]))


def test_grpo_with_a_length_reward_raises_the_mean_reward(studio):
    cfg = presets.load_preset("grpo-demo")  # the built-in GRPO demo, as a user starts it
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=900)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 80)}"
    key = "rewards/length/mean"
    rewards = studio.metrics(run_id, keys=[key]).dropna(subset=[key])[key].tolist()
    assert len(rewards) == cfg.max_steps
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"GRPO length reward: first 5 steps {first:.3f}, last 5 steps {last:.3f}")
    assert last > first + 0.25, rewards
