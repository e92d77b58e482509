"""Runs, the queue, their timeline events and export artifacts: the Store's run aggregate (db/store.py composes it).

Every write that is not derived from a run's events.jsonl also goes to the run folder's journal (``_journal``), so
``db rebuild`` can restore it."""
from __future__ import annotations

import time
from typing import Any, Iterable

from sqlalchemy import func, or_
from sqlalchemy.orm import defer
from sqlmodel import Session, col, delete, select

from db.entities import ArtifactRecord, EventRecord, RunRecord
from db.models import Artifact, EvalResult, EvalSample, Metric, MetricValue, Run, RunEvent, Sample
from trainer_core.protocol import journal
from trainer_core.protocol.status import RunStatus


class RunsStore:
    """Store methods on runs; ``self`` is the Store (engine, write lock, backend)."""

    def create_run(self, record: RunRecord) -> RunRecord:
        run = record.to_row()
        self._journal(run.id, "create", row=run.model_dump())
        with self._write_lock, Session(self.engine) as session:
            session.add(run)
            session.add(RunEvent(run_id=run.id, ts=run.created_at or time.time(), kind="status",
                                 message=record.status.label))
            session.commit()
            session.refresh(run)
            return RunRecord.from_row(run)

    def update_run(self, run_id: str, **values: Any) -> None:
        """Update progress fields of a run that is not finished (finished runs only change via finish_run)."""
        with self._write_lock, Session(self.engine) as session:
            run = session.get(Run, run_id)
            if run is None or RunStatus(run.status).is_terminal():
                return
            self._journal(run_id, "update", values=values)
            for key, value in values.items():
                setattr(run, key, value)
            session.add(run)
            session.commit()

    def add_event(self, run_id: str, kind: str, message: str, ts: float | None = None) -> None:
        ts = ts or time.time()
        self._journal(run_id, "event", ts=ts, kind=kind, message=message)
        with self._write_lock, Session(self.engine) as session:
            session.add(RunEvent(run_id=run_id, ts=ts, kind=kind, message=message))
            session.commit()

    def finish_run(self, run_id: str, status: RunStatus, **values: Any) -> bool:
        """Move a run to a terminal status once. Returns False if it was already finished."""
        if not status.is_terminal():
            raise ValueError(f"{status} is not a terminal status")
        with self._write_lock, Session(self.engine) as session:
            run = session.get(Run, run_id)
            if run is None or RunStatus(run.status).is_terminal():
                return False
            run.status = status.value
            run.finished_at = values.pop("finished_at", None) or time.time()
            values.setdefault("phase", "")  # "saving" or "training" is stale once the run has ended
            self._journal(run_id, "finish", status=status.value, values={**values, "finished_at": run.finished_at})
            for key, value in values.items():
                setattr(run, key, value)
            session.add(run)
            session.add(RunEvent(run_id=run_id, ts=run.finished_at, kind="status",
                                 message=status.label + (f": {run.error.splitlines()[0]}" if run.error else "")))
            session.commit()
            return True

    def delete_run(self, run_id: str) -> bool:
        with self._write_lock, Session(self.engine) as session:
            run = session.get(Run, run_id)
            if run is None:
                return False
            if not RunStatus(run.status).is_terminal():
                raise ValueError(f"run {run_id} is {run.status}; stop or cancel it before deleting")
            self._journal(run_id, "delete")  # a rebuild must not bring back a run deleted with its folder kept
            session.exec(delete(Metric).where(Metric.run_id == run_id))
            session.exec(delete(MetricValue).where(MetricValue.run_id == run_id))
            session.exec(delete(RunEvent).where(RunEvent.run_id == run_id))
            session.exec(delete(Sample).where(Sample.run_id == run_id))
            session.exec(delete(EvalSample).where(EvalSample.job_id == run_id))
            session.exec(delete(EvalResult).where(EvalResult.job_id == run_id))
            session.exec(delete(Artifact).where(Artifact.job_id == run_id))  # the rows; the files stay
            session.delete(run)
            session.commit()
            return True

    def get_run(self, run_id: str) -> RunRecord | None:
        with Session(self.engine) as session:
            row = session.get(Run, run_id)
            return RunRecord.from_row(row) if row is not None else None

    def list_runs(self, limit: int = 500, offset: int = 0, search: str = "",
                  owners: list[str] | None = None, kinds: list[str] | None = None) -> list[RunRecord]:
        """Runs newest first, ``limit`` from ``offset``; ``search`` is a case-insensitive part of the id, name,
        model, dataset, method or sweep id (a sweep's trials); ``owners``, when given, keeps the runs these users
        started, ``kinds`` the jobs of these kinds. Rows come without config_json and log_tail (read them with get_run)."""
        query = self._search(select(Run), search, owners, kinds).order_by(col(Run.created_at).desc(), col(Run.id).desc())
        query = query.options(defer(Run.config_json, raiseload=True), defer(Run.log_tail, raiseload=True))
        with Session(self.engine) as session:
            return [RunRecord.from_row(row) for row in session.exec(query.offset(offset).limit(limit))]

    def count_runs(self, search: str = "", owners: list[str] | None = None, kinds: list[str] | None = None) -> int:
        with Session(self.engine) as session:
            return int(session.exec(self._search(select(func.count()).select_from(Run), search, owners, kinds)).one())

    def run_ids(self) -> set[str]:
        """The id of every run the database knows."""
        with Session(self.engine) as session:
            return set(session.exec(select(Run.id)).all())

    def run_owners(self) -> list[str]:
        """Everyone who started a run, sorted (History's owner filter)."""
        with Session(self.engine) as session:
            return sorted(session.exec(select(Run.owner).where(Run.owner != "").distinct()).all())

    def get_runs(self, run_ids: list[str]) -> list[RunRecord]:
        """The runs with these ids that exist, in the order asked for."""
        if not run_ids:
            return []
        with Session(self.engine) as session:
            found = {r.id: RunRecord.from_row(r) for r in session.exec(select(Run).where(col(Run.id).in_(run_ids)))}
        return [found[i] for i in dict.fromkeys(run_ids) if i in found]

    def find_runs(self, ref: str, limit: int = 10) -> list[RunRecord]:
        """Runs whose id starts with ``ref`` or whose name is ``ref``."""
        prefix = _like_escape(ref) + "%"
        with Session(self.engine) as session:
            rows = session.exec(select(Run).where(or_(col(Run.id).like(prefix, escape="\\"), Run.name == ref))
                                .order_by(col(Run.created_at).desc()).limit(limit))
            return [RunRecord.from_row(row) for row in rows]

    @staticmethod
    def _search(query, search: str, owners: list[str] | None = None, kinds: list[str] | None = None):
        if owners:
            query = query.where(col(Run.owner).in_(owners))
        if kinds:
            query = query.where(col(Run.kind).in_([str(k) for k in kinds]))
        search = search.strip().lower()
        if not search:
            return query
        pattern = "%" + _like_escape(search) + "%"
        return query.where(or_(*[func.lower(column).like(pattern, escape="\\")
                                 for column in (Run.id, Run.name, Run.model, Run.dataset, Run.method, Run.sweep_id)]))

    def active_runs(self) -> list[RunRecord]:
        """Runs with a worker (starting, running, stopping): everything not finished and not queued."""
        live = [s.value for s in RunStatus if not s.is_terminal() and s is not RunStatus.QUEUED]
        with Session(self.engine) as session:
            return [RunRecord.from_row(r) for r in session.exec(select(Run).where(Run.status.in_(live))
                                                                    .order_by(Run.created_at))]

    def queued_runs(self) -> list[RunRecord]:
        """The queue, in the order the runs will start."""
        with Session(self.engine) as session:
            return [RunRecord.from_row(r) for r in session.exec(select(Run).where(Run.status == RunStatus.QUEUED.value)
                                                                .order_by(Run.queue_position, Run.created_at))]

    def next_queue_position(self) -> float:
        with Session(self.engine) as session:
            top = session.exec(select(func.max(Run.queue_position))
                               .where(Run.status == RunStatus.QUEUED.value)).one()
        return (top or 0.0) + 1.0

    def move_in_queue(self, run_id: str, offset: int) -> bool:
        """Move a queued run ``offset`` places (negative: towards the front). False if it is not queued."""
        with self._write_lock, Session(self.engine) as session:
            queue = list(session.exec(select(Run).where(Run.status == RunStatus.QUEUED.value)
                                      .order_by(Run.queue_position, Run.created_at)))
            ids = [r.id for r in queue]
            if run_id not in ids:
                return False
            old = ids.index(run_id)
            new = max(0, min(len(ids) - 1, old + offset))
            ids.insert(new, ids.pop(old))
            by_id = {r.id: r for r in queue}
            for position, queued_id in enumerate(ids, start=1):
                by_id[queued_id].queue_position = float(position)
                session.add(by_id[queued_id])
            session.commit()
            return True

    def sweep_runs(self, sweep_id: str) -> list[RunRecord]:
        """The trial runs of a sweep, oldest first (a trial resumed after its sweep stopped has several)."""
        with Session(self.engine) as session:
            return [RunRecord.from_row(r) for r in session.exec(select(Run).where(Run.sweep_id == sweep_id)
                                                                .order_by(Run.created_at, Run.id))]

    def children(self, run_id: str) -> list[RunRecord]:
        with Session(self.engine) as session:
            return [RunRecord.from_row(r) for r in session.exec(select(Run).where(Run.parent_run_id == run_id)
                                                                .order_by(Run.created_at))]

    def get_events(self, run_id: str) -> list[EventRecord]:
        with Session(self.engine) as session:
            return [EventRecord.from_row(e) for e in session.exec(select(RunEvent).where(RunEvent.run_id == run_id)
                                                                  .order_by(RunEvent.ts, RunEvent.id))]

    def event_counts(self, run_ids: list[str], kind: str) -> dict[str, int]:
        """How many events of one kind each run has (runs with none are left out)."""
        if not run_ids:
            return {}
        with Session(self.engine) as session:
            rows = session.exec(select(RunEvent.run_id, func.count()).where(RunEvent.run_id.in_(run_ids))
                                .where(RunEvent.kind == kind).group_by(RunEvent.run_id)).all()
        return {run_id: int(count) for run_id, count in rows}

    def add_artifacts(self, rows: Iterable[dict[str, Any]]) -> None:
        """Record published artifacts; the same (job, path) again replaces its row (a replayed log is harmless)."""
        with self._write_lock, Session(self.engine) as session:
            for row in rows:
                session.merge(Artifact(**row))
            session.commit()

    def artifacts(self, job_id: str | None = None, source_run_id: str | None = None) -> list[ArtifactRecord]:
        """Artifacts of an export job, or of every export of a run, newest first."""
        query = select(Artifact)
        if job_id is not None:
            query = query.where(Artifact.job_id == job_id)
        if source_run_id is not None:
            query = query.where(Artifact.source_run_id == source_run_id)
        with Session(self.engine) as session:
            rows = session.exec(query.order_by(col(Artifact.created_at).desc(), Artifact.path)).all()
            return [ArtifactRecord.from_row(r) for r in rows]

    def _journal(self, run_id: str, op: str, **data: Any) -> None:
        if self.journal:
            journal.append(run_id, op, **data)


def _like_escape(text_: str) -> str:
    """``text_`` as a literal inside a LIKE pattern that uses backslash as its escape character."""
    return text_.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
