"""A GRPO rollout with tools (issue 32) as a sample: its turns go from the event through the pump's handler (the one
``db rebuild`` replays) into the database, and the run pages read them back as calls, results and the final answer."""
from __future__ import annotations

import time

from db.entities import RunRecord
from trainer_core.jobs import pump
from trainer_core.jobs.live import LiveRun
from trainer_core.protocol import events as ev
from trainer_core.protocol.status import JobKind, RunStatus
from ui.samples import reward_text, sampling_configured, trajectory_lines

RUN = "20260101-000000-tttttt"
TURNS = [{"role": "assistant", "content": "Let me add.", "calls": [{"name": "add", "arguments": '{"a": 2, "b": 3}'}]},
         {"role": "tool", "name": "add", "content": "5"},
         {"role": "assistant", "content": "The sum is 5.", "calls": []}]


def test_a_trajectory_is_stored_and_read_back_as_calls_results_and_answer(tmp_path, store):
    store.create_run(RunRecord(id=RUN, name="agent", status=RunStatus.RUNNING.value, created_at=time.time()))
    t = pump.Tracker(RUN, tmp_path, LiveRun(RUN, "agent", RunStatus.RUNNING), 0, lock_fh=None, kind=JobKind.TRAIN)
    pump.handle(t, ev.SampleEvent(step=3, index=0, prompt="Add 2 and 3.", text="The sum is 5.", turns=TURNS,
                                  flags={"reward:got_five": "1", "reward:length": "0.25"}, ts=3.0))
    pump.handle(t, ev.SampleEvent(step=3, index=1, prompt="Add 2 and 3.", text="5", ts=3.0))
    pump.flush(t, store)
    first, second = store.samples(RUN)
    assert first.turns == tuple(TURNS) and second.turns == ()
    assert trajectory_lines(first) == [("model", "Let me add."), ("call add", '{"a": 2, "b": 3}'),
                                       ("result of add", "5"), ("model", "The sum is 5.")]
    assert reward_text(first.flags) == "got_five 1 · length 0.25"


def test_grpo_runs_show_their_samples_unless_sampling_is_off():
    assert sampling_configured({"method": "grpo", "grpo": {}})
    assert not sampling_configured({"method": "grpo", "grpo": {"sample_every": 0}})
    assert not sampling_configured({"method": "sft"})
