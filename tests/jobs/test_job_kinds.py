"""The one table of job kinds (trainer_core.protocol.status.JOB_KINDS): every row names modules that exist and fit
together, so a new kind is its modules plus one row, and a row that names a missing piece fails here, not at run time.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

from trainer_core.config import TrainConfig
from trainer_core.specs import jobspec
from trainer_core.jobs.pump import HANDLERS, LIFECYCLE
from trainer_core.protocol import events
from trainer_core.protocol.status import JOB_KINDS, JobKind, RunStatus
from trainer_core.worker import ENTRY_POINTS


def test_every_kind_has_one_row_and_the_other_tables_are_read_from_it():
    assert list(JOB_KINDS) == list(JobKind)
    assert ENTRY_POINTS == {kind: entry.worker for kind, entry in JOB_KINDS.items()}
    assert len({entry.label for entry in JOB_KINDS.values()}) == len(JOB_KINDS)


@pytest.mark.parametrize("kind", list(JobKind))
def test_a_rows_modules_exist_and_fit(kind):
    entry = JOB_KINDS[kind]
    # the worker's entry point defines main(run_dir) at its top level (read, not imported: it may import torch)
    found = importlib.util.find_spec(entry.worker)
    assert found is not None and found.origin, f"{kind}: no module {entry.worker}"
    tree = ast.parse(Path(found.origin).read_text())
    assert any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body), entry.worker
    # its settings: training's are TrainConfig; every other kind's is the JobSpec registered for it, in that module
    module = importlib.import_module(entry.settings)
    if kind is JobKind.TRAIN:
        assert module.TrainConfig is TrainConfig
    else:
        assert jobspec.SPEC_TYPES[kind].__module__ == entry.settings and jobspec.SPEC_TYPES[kind].KIND is kind
    # its own events are events the log can carry, each with a handler, beside the lifecycle every kind shares
    assert set(HANDLERS[kind]) == set(LIFECYCLE) | set(entry.events)
    for name in entry.events:
        assert name in events._SPECS, f"{kind}: {name!r} is no event kind of trainer_core.protocol.events"
    assert kind.label == entry.label and kind.status_label(RunStatus.RUNNING) == entry.running
    assert kind.status_label(RunStatus.QUEUED) == RunStatus.QUEUED.label
