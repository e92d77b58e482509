"""`python -m trainer_core rewards check` (issue 19): a GRPO config's rewards run on a few real rows before the
run starts, in a child process; a reward that raises is named with its message and line (exit 1), one that gives
every completion the same score is a warning, and a config that is not GRPO is refused (exit 2)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import ROOT

pytestmark = pytest.mark.subprocess  # the check runs in a child process that loads the data (and the reward file)

ROWS = [{"prompt": f"What is {a} plus {b}?", "answer": f"{a + b}"} for a, b in ((2, 3), (4, 4), (10, 5), (7, 1))]

REWARDS_PY = '''
def exact(prompts, completions, answer, **_):
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]


def broken(prompts, completions, **_):
    raise ValueError("boom from my reward")
'''


def write_case(tmp_path: Path, rewards: list[dict], method: str = "grpo") -> Path:
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "my_rewards.py").write_text(REWARDS_PY)
    config = {"method": method, "local_datasets": [str(data)], "max_seq_length": 256,
              "grpo": {"num_generations": 2, "max_prompt_length": 64, "max_completion_length": 32,
                       "rewards": rewards}}
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def check(tmp_path: Path, config: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "FINETUNE_STUDIO_HOME": str(tmp_path / "home"), "FINETUNE_STUDIO_FORCE_CPU": "1",
           "FINETUNE_STUDIO_ALLOWED_ROOTS": str(tmp_path)}
    env.pop("FINETUNE_STUDIO_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "trainer_core", "rewards", "check", "--config", str(config)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_a_reward_that_raises_is_named_with_its_message_and_line(tmp_path):
    config = write_case(tmp_path, [{"python": str(tmp_path / "my_rewards.py"), "function": "exact"},
                                   {"python": str(tmp_path / "my_rewards.py"), "function": "broken"}])
    result = check(tmp_path, config)
    assert result.returncode == 1, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "4 completions scored"  # the data's reference answers, no model loaded
    exact = next(line for line in lines if line.startswith("exact "))
    assert "mean 1, spread 0" in exact and "scores [1, 1, 1, 1]" in exact  # the references are right
    broken = next(line for line in lines if line.startswith("broken "))
    assert broken.endswith('ERROR ValueError: boom from my reward (line 7: raise ValueError("boom from my reward"))')
    assert any(line.startswith("warning: broken raised") for line in lines)


def test_a_constant_reward_is_a_warning_not_a_failure(tmp_path):
    config = write_case(tmp_path, [{"type": "contains", "keywords": ["zebra"]}])
    result = check(tmp_path, config)
    assert result.returncode == 0, result.stderr[-2000:]
    assert any("gave every completion the same score (0): a group with zero spread teaches nothing" in line
               for line in result.stdout.splitlines()), result.stdout


def test_a_config_that_is_not_grpo_is_refused(tmp_path):
    config = write_case(tmp_path, [], method="sft")
    result = check(tmp_path, config)
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: method: rewards are checked for method grpo, this config trains sft: "
                                     "set method: grpo")


MISBEHAVING_PY = '''
import os
import sys


def sometimes_inf(prompts, completions, **_):
    return [float("inf")] + [1.0] * (len(completions) - 1)


def always_nan(prompts, completions, **_):
    return [float("nan")] * len(completions)


def words(prompts, completions, **_):
    return ["good"] * len(completions)


def quits(prompts, completions, **_):
    sys.exit(3)


def hard_quits(prompts, completions, **_):
    os._exit(4)
'''


def test_misbehaving_rewards_are_each_named_in_their_own_row_and_the_check_goes_on(tmp_path):
    # before: inf/NaN crashed the report with a traceback, and sys.exit/os._exit ended the check naming no reward
    (tmp_path / "bad.py").write_text(MISBEHAVING_PY)
    names = ["sometimes_inf", "always_nan", "words", "quits", "hard_quits"]
    config = write_case(tmp_path, [{"python": str(tmp_path / "bad.py"), "function": name} for name in names]
                        + [{"type": "contains", "keywords": ["1"]}])
    result = check(tmp_path, config)
    assert result.returncode == 1, result.stderr[-2000:]
    rows = {line.split(" ")[0]: line for line in result.stdout.splitlines()}
    assert rows["sometimes_inf"].endswith("; scores [None, 1, 1, 1]")
    assert rows["always_nan"].endswith("ERROR returned non-finite scores (NaN or inf) for 4 of its 4 scores so far, "
                                       "more than half: make it return finite floats (None for a completion it does "
                                       "not score)")
    assert rows["words"].endswith("ERROR returned a str ('good') for completion 0: each score is a float, or None for "
                                  "a completion it does not score")
    assert rows["quits"].endswith("ERROR called sys.exit(3): a reward returns its scores and never ends the worker "
                                  "(line 19: sys.exit(3))")
    assert rows["hard_quits"].endswith("ERROR called os._exit(4): a reward returns its scores and never ends the "
                                       "worker (line 23: os._exit(4))")
    assert rows["contains"].startswith("contains (contains, weight 1): mean 0.25")  # the rewards after them ran
    assert ("warning: reward 'sometimes_inf' returned inf for 1 of 4 completions: those scores are left out (as None) "
            "and training goes on; past half of its scores the run stops. Make it return finite floats (None for a "
            "completion it does not score).") in result.stdout.splitlines()
