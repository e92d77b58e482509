"""The pump's handlers for an eval job's own events: each scored sample and the overall result go to the
database (through the tracker's ``writes``, stored at its next flush with the log offset after them), so
the Evaluation tab shows partial results while the job runs and ``db rebuild`` restores them from the log."""
from __future__ import annotations

import dataclasses
from typing import Any

from trainer_core.protocol import events as ev

SAMPLE_FIELDS = ("prompt", "reference", "answer", "exact", "rouge_l", "bleu", "loss", "tokens", "judge")


def on_sample(t: Any, e: ev.EvalSampleEvent) -> None:
    row = {name: getattr(e, name) for name in SAMPLE_FIELDS}
    for name in ("prompt", "reference", "answer"):  # test files may hold NUL, which PostgreSQL refuses in text: the
        row[name] = row[name].replace("\x00", "\ufffd")  # failing write blocked the job's later events for good
    t.writes.append(lambda store, run_id=t.run_id, index=e.index: store.save_eval_sample(run_id, index, **row))
    t.urgent = True


def on_result(t: Any, e: ev.EvalResultEvent) -> None:
    values = {f.name: getattr(e, f.name) for f in dataclasses.fields(e) if f.name not in ("ts", "nonfinite")}
    t.writes.append(lambda store, run_id=t.run_id: store.save_eval_result(run_id, created_at=e.ts, **values))
    t.urgent = True
