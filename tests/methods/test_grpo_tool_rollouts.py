"""An agent trained with rewards (issue 32): a GRPO run with ``grpo.tools`` calls the tool during its rollouts, the
tool's results go back to the model, a tool that raises is an error result the model sees (one warning naming it)
and the run goes on, the rewards read the whole trajectory, and the samples carry the trajectory's turns into the
database. The model is the tiny Llama taught (in a child process, once per checkout) to answer "Add 2 and 3." with a
Hermes call to ``add`` and then "The sum is 5.": a random model never writes a call, and the bundled SmolLM2 does
not either (0 of 16 sampled answers) — so this proves the wiring, not that GRPO teaches tool use."""
from __future__ import annotations

import json

import pytest

from tests.support.tool_agent import agent_config
from trainer_core.protocol import events as ev, paths
from trainer_core.protocol.status import RunStatus

pytestmark = pytest.mark.train


def test_a_grpo_run_with_a_tool_records_trajectories(studio, tmp_path):
    cfg = agent_config(tmp_path)
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 60)}"

    run_dir = paths.run_dir(run_id)
    assert json.loads((run_dir / "tools" / "manifest.json").read_text())[0]["functions"] == ["add"]
    events, _ = ev.read_new(run_dir / ev.LOG_NAME, 0)
    warnings = [e.message for e in events if isinstance(e, ev.WarningEvent) and "tool 'add'" in e.message]
    assert len(warnings) == 1 and warnings[0].startswith("tool 'add' raised ValueError: the adder is out of order")
    progress = [e.metrics for e in events if isinstance(e, ev.ProgressEvent) and "tools/call_frequency" in e.metrics]
    assert progress and all(m["tools/call_frequency"] > 0 for m in progress)

    turns = [s.turns for s in studio.samples(run_id) if s.turns]
    calls = [c for t in turns for turn in t for c in turn.get("calls", ())]
    results = [turn["content"] for t in turns for turn in t if turn["role"] == "tool"]
    assert calls and all(c["name"] == "add" for c in calls)
    assert {json.dumps(json.loads(c["arguments"]), sort_keys=True) for c in calls} == {'{"a": 2, "b": 3}'}
    assert "5" in results
    assert "{'error': \"tool 'add' raised ValueError: the adder is out of order\"}" in results
    scored = {s.flags.get("reward:got_five") for s in studio.samples(run_id) if s.turns}
    assert scored <= {"0", "1"} and "1" in scored
