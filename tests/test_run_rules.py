"""trainer_core.views.run_rules: the run rules History, Run details and Compare share."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainer_core.views.run_rules import can_resume, run_labels, run_name
from trainer_core.protocol.status import JobKind, RunStatus
from ui import format as fmt


@pytest.mark.parametrize("status, offered", [
    (RunStatus.STOPPED, True), (RunStatus.FAILED, True), (RunStatus.CANCELLED, True),
    (RunStatus.COMPLETED, False),  # nothing left to train
    (RunStatus.QUEUED, False), (RunStatus.STARTING, False), (RunStatus.RUNNING, False), (RunStatus.STOPPING, False),
])
def test_resume_is_offered_for_runs_that_ended_without_completing(status, offered):
    assert can_resume(status) is offered
    assert can_resume(status.value) is offered  # the database's text


def run(run_id: str, name: str, status: RunStatus = RunStatus.COMPLETED) -> SimpleNamespace:
    return SimpleNamespace(id=run_id, name=name, status=status.value, created_at=0.0, kind=JobKind.TRAIN)


def test_a_run_is_called_by_its_name_or_else_its_id():
    assert (run_name(run("r1", "alpha")), run_name(run("r2", ""))) == ("alpha", "r2")


def test_run_labels_are_unique():
    runs = [run("r1", "same"), run("r2", "same"), run("r3", ""), run("r4", "other")]
    assert run_labels(runs) == {"r1": "same · r1", "r2": "same · r2", "r3": "r3", "r4": "other"}


def test_a_run_in_a_picker_shows_name_status_and_time():
    assert fmt.run_choice(run("r7", "", RunStatus.FAILED)) == \
        f"r7 · {fmt.status_badge(RunStatus.FAILED)} · {fmt.timestamp(0.0)}"
