"""Eval results and their per-sample rows (issue 11): the Store's eval aggregate (db/store.py composes it)."""
from __future__ import annotations

import json
from typing import Any

import pandas as pd
from sqlmodel import Session, col, select

from db.entities import EvalResultRecord
from db.models import EvalResult, EvalSample, Run
from trainer_core.protocol.status import RunStatus


class EvalsStore:
    """Store methods on evals; ``self`` is the Store (engine, write lock, backend)."""

    def save_eval_result(self, job_id: str, **values: Any) -> None:
        """Create or update an eval job's result row (``metrics`` a dict, stored as JSON). Idempotent: the
        pump replays the same event after a restart, the orchestrator creates the row at submission."""
        if "metrics" in values:
            metrics = values.pop("metrics")
            values["metrics_json"] = None if metrics is None else json.dumps(metrics, sort_keys=True)
        with self._write_lock, Session(self.engine) as session:
            row = session.get(EvalResult, job_id) or EvalResult(job_id=job_id)
            for key, value in values.items():
                setattr(row, key, value)
            session.add(row)
            session.commit()

    def save_eval_sample(self, job_id: str, index: int, **values: Any) -> None:
        """Create or replace one scored sample of an eval job (idempotent on (job, index))."""
        with self._write_lock, Session(self.engine) as session:
            row = session.get(EvalSample, (job_id, index)) or EvalSample(job_id=job_id, index=index)
            for key, value in values.items():
                setattr(row, key, value)
            session.add(row)
            session.commit()

    def eval_result(self, job_id: str) -> EvalResultRecord | None:
        with Session(self.engine) as session:
            found = session.exec(select(EvalResult, Run.status).join(Run, Run.id == EvalResult.job_id)
                                 .where(EvalResult.job_id == job_id)).first()
        return EvalResultRecord.from_row(*found) if found else None

    def eval_results(self, source_run_id: str) -> list[EvalResultRecord]:
        """Every eval of a run's models (final and checkpoints), newest first."""
        with Session(self.engine) as session:
            rows = session.exec(select(EvalResult, Run.status).join(Run, Run.id == EvalResult.job_id)
                                .where(EvalResult.source_run_id == source_run_id)
                                .order_by(col(EvalResult.created_at).desc())).all()
        return [EvalResultRecord.from_row(row, status) for row, status in rows]

    def find_eval(self, source_key: str, data_fingerprint: str, settings_hash: str) -> EvalResultRecord | None:
        """The newest eval of ``source_key`` on the same data with the same settings that completed or may
        still complete (queued or running); failed, stopped and cancelled ones do not count."""
        gone = [s.value for s in (RunStatus.FAILED, RunStatus.STOPPED, RunStatus.CANCELLED)]
        with Session(self.engine) as session:
            found = session.exec(select(EvalResult, Run.status).join(Run, Run.id == EvalResult.job_id)
                                 .where(EvalResult.source_key == source_key,
                                        EvalResult.data_fingerprint == data_fingerprint,
                                        EvalResult.settings_hash == settings_hash, col(Run.status).not_in(gone))
                                 .order_by(col(EvalResult.created_at).desc())).first()
        return EvalResultRecord.from_row(*found) if found else None

    def eval_samples(self, job_id: str) -> pd.DataFrame:
        """An eval job's scored samples, in test-file order."""
        columns = ("index", "prompt", "reference", "answer", "exact", "rouge_l", "bleu", "loss", "tokens", "judge")
        with Session(self.engine) as session:
            rows = session.exec(select(*[getattr(EvalSample, c) for c in columns])
                                .where(EvalSample.job_id == job_id).order_by(EvalSample.index)).all()
        return pd.DataFrame([tuple(r) for r in rows], columns=list(columns))

    def latest_eval_metrics(self, run_ids: list[str]) -> dict[str, dict]:
        """Per run id: the metrics of the newest completed eval of one of its models (runs without one are
        left out). History's score column."""
        if not run_ids:
            return {}
        with Session(self.engine) as session:
            rows = session.exec(select(EvalResult.source_run_id, EvalResult.metrics_json)
                                .join(Run, Run.id == EvalResult.job_id)
                                .where(col(EvalResult.source_run_id).in_(run_ids),
                                       col(EvalResult.metrics_json).is_not(None),
                                       Run.status == RunStatus.COMPLETED.value)
                                .order_by(col(EvalResult.created_at).desc())).all()
        latest: dict[str, dict] = {}
        for run_id, metrics in rows:
            latest.setdefault(run_id, json.loads(metrics))
        return latest
