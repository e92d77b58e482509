"""The store returns typed records, never ORM rows: a status is a RunStatus, a kind a JobKind, the names of a
run's secrets a tuple; records round-trip through the table unchanged."""
from __future__ import annotations

import dataclasses

from db.entities import EventRecord, RunRecord
from trainer_core.protocol.status import JobKind, RunStatus


def test_records_come_back_typed(store):
    made = RunRecord(id="r1", name="one", status="running", needs_secrets="hf_token,wandb_token", created_at=1.0)
    assert made.status is RunStatus.RUNNING and made.kind is JobKind.TRAIN  # text as the table holds it is typed once
    assert made.needs_secrets == ("hf_token", "wandb_token")
    created = store.create_run(made)
    got = store.get_run("r1")
    assert isinstance(got, RunRecord) and got == created == made
    assert [type(r) for r in (*store.list_runs(), *store.active_runs(), *store.get_runs(["r1"]),
                              *store.find_runs("r1"))] == [RunRecord] * 4
    [event] = store.get_events("r1")
    assert isinstance(event, EventRecord) and (event.kind, event.message) == ("status", "Training")


def test_a_listed_record_leaves_out_the_large_columns(store):
    store.create_run(RunRecord(id="r1", config_json='{"max_steps": 3}', log_tail="last lines"))
    [listed] = store.list_runs()
    assert (listed.config_json, listed.log_tail) == (None, None)  # a History page never reads them
    full = store.get_run("r1")
    assert (full.config_json, full.log_tail) == ('{"max_steps": 3}', "last lines")
    assert dataclasses.replace(listed, config_json=full.config_json, log_tail=full.log_tail) == full


def test_a_journal_row_from_before_kinds_is_a_training_job():
    row = {"id": "old", "status": "completed", "needs_secrets": "", "a_column_from_the_future": 1}
    record = RunRecord.from_dict(row)
    assert (record.kind, record.status, record.needs_secrets) == (JobKind.TRAIN, RunStatus.COMPLETED, ())
