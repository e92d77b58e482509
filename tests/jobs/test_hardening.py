"""Issue 24 hardening of the job machinery: a bad job.json fails alone and the queue moves on; paths from a run
folder stay inside it; forged event values are refused where they enter; `db rebuild` is for admins, finishes,
and keeps every job it can."""
from __future__ import annotations

import json

import pytest

from tests.support import fake, wait_until
from tests.test_jobspec import make_run
from trainer_core.jobspec import ModelSource
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus


# ====================================================================== the queue and job.json
@pytest.mark.parametrize("edit", [{"targets": [["adapter"]]}, {"quantizations": [["q8_0"]]}, {"source": []}])
def test_a_queued_job_whose_job_json_was_spoiled_fails_alone_and_the_queue_moves_on(orch, home, monkeypatch, edit):
    """It passed validate() at submit; edited while queued, its turn raised TypeError on every pump tick and
    every job behind it stayed queued forever."""
    from trainer_core.export.spec import ExportSpec

    make_run("20260101-000000-srcsrc")
    pause = home / "go"
    cfg = fake(monkeypatch, steps=3)
    monkeypatch.setenv("FAKE_PAUSE_AT", "1")  # the first run holds the device until the test says so
    monkeypatch.setenv("FAKE_PAUSE_UNTIL", str(pause))
    first = orch.start(cfg)
    export = orch.submit(ExportSpec(source=ModelSource(run_id="20260101-000000-srcsrc"), targets=["adapter"],
                                    verify=False))
    behind = orch.start(cfg)
    assert [orch.get_run(i).status for i in (export, behind)] == [RunStatus.QUEUED, RunStatus.QUEUED]
    spec_file = paths.run_dir(export) / "job.json"
    spec_file.write_text(json.dumps({**json.loads(spec_file.read_text()), **edit}))

    monkeypatch.delenv("FAKE_PAUSE_AT")
    pause.write_text("")
    orch.wait(first, timeout=30, interval=0.05)
    wait_until(lambda: orch.get_run(export).status is RunStatus.FAILED, what="the spoiled job failed")
    field = next(iter(edit))
    assert orch.get_run(export).error.startswith(f"its job.json cannot be read: {field}: ")
    done = orch.wait(behind, timeout=30, interval=0.05)
    assert done.status is RunStatus.COMPLETED
