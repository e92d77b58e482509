"""The store: the one write path to the database.

SQLite (WAL) under the data root by default; ``DATABASE_URL`` switches to PostgreSQL. Metrics are
upserted on (run_id, step) and merged field by field, so an eval row and a train row for the same
step become one row, and replaying events after a re-attach never duplicates anything. Open metric keys
(any key besides the wide columns) go to a long table on (run_id, step, key) in the same transaction
(db/metrics_store.py).
"""
from __future__ import annotations

import functools
import json
import operator
import os
import threading
import time
from typing import Any, Iterable

import adbc_driver_manager
import adbc_driver_sqlite.dbapi as adbc_sqlite
import pandas as pd
from sqlalchemy import event as sa_event
from sqlalchemy import Float, Integer, bindparam, case, func, inspect, or_, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import defer
from sqlmodel import Session, SQLModel, col, create_engine, delete, select

from db.entities import ArtifactRecord, EvalResultRecord, EventRecord, RunRecord, SampleRecord
from db.metrics_store import OpenMetrics
from db.models import Artifact, EvalResult, EvalSample, Metric, MetricValue, Run, RunEvent, Sample
from trainer_core.protocol import journal, paths, training_type
from trainer_core.protocol.metrics import METRIC_FIELDS, merge_nonfinite, merge_rows, thin
from trainer_core.protocol.status import RunStatus

SPARKLINE_POINTS = 60
FINISHED_FRAMES_CACHED = 12  # metric frames of finished runs kept in memory (a 100k-step frame is ~10 MB)
ARROW_IDLE_CONNECTIONS = 4  # column-wise (ADBC) read connections kept open between reads
try:  # the PostgreSQL extra; without it PostgreSQL frames are read row by row (slower, the same frames)
    import adbc_driver_postgresql.dbapi as adbc_postgresql
except ImportError:
    adbc_postgresql = None
_TERMINAL_VALUES = tuple(s.value for s in RunStatus if s.is_terminal())


def default_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if url:
        # Heroku-style URLs say postgres://; SQLAlchemy wants postgresql://
        return url.replace("postgres://", "postgresql://", 1) if url.startswith("postgres://") else url
    return f"sqlite:///{paths.data_root() / 'studio.db'}"


def _enable_wal(dbapi_conn, _record) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


class Store:
    def __init__(self, url: str | None = None, journal: bool = True):
        self.url = url or default_url()
        # Writes not derived from events.jsonl also go to the run folder's journal, so `db rebuild` can
        # restore them; the rebuild itself writes with journal=False (it replays those very records).
        self.journal = journal
        self.is_sqlite = self.url.startswith("sqlite")
        connect_args = {"check_same_thread": False, "timeout": 30} if self.is_sqlite else {}
        self.engine = create_engine(self.url, connect_args=connect_args, pool_pre_ping=not self.is_sqlite)
        if self.is_sqlite:
            sa_event.listen(self.engine, "connect", _enable_wal)
        SQLModel.metadata.create_all(self.engine)
        _add_missing_columns(self.engine)
        _add_missing_indexes(self.engine)
        self._write_lock = threading.Lock()  # SQLite allows one writer; serialise ours instead of retrying
        # The metric upsert is compiled once, to the driver's own SQL, and run with all rows of a batch as
        # one executemany: a multi-VALUES statement built per batch spent most of the pump's time compiling,
        # and SQLAlchemy's per-row parameter processing cost more than the database's own work.
        compiled = self._upsert().compile(dialect=self.engine.dialect)
        self._upsert_sql = compiled.string
        self._upsert_constants = {k: v for k, v in compiled.params.items() if k not in ("run_id", "step",
                                                                                      *METRIC_FIELDS)}
        # Parameter names in order for positional drivers (SQLite); named drivers take the dict itself.
        self._upsert_order = operator.itemgetter(*compiled.positiontup) if compiled.positiontup else None
        # PostgreSQL: the whole batch as one statement over one array per column (unnest), with the same
        # ON CONFLICT merge: executemany still ran the statement once per row on the server (~3x the time).
        self._batch_upsert_sql = None if self.is_sqlite else self._unnest_upsert(compiled.string)
        columns = Metric.__table__.c
        self._frame_stmt = (select(*[columns[c] for c in ("step", *METRIC_FIELDS)])
                            .where(columns.run_id == bindparam("run_id")).order_by(columns.step))
        self._frame_from_stmt = self._frame_stmt.where(columns.step >= bindparam("from_step"))
        # Finished runs never change, so their frames are cached by (run id, finish time).
        self._finished_frame = functools.lru_cache(maxsize=FINISHED_FRAMES_CACHED)(self._read_frame)
        # Whole frames are read column-wise through ADBC into Arrow: the row-wise DB-API drivers build a
        # Python tuple per row and an object per value (~3x the time of the Arrow read for 100k rows).
        self._arrow_connect, self._arrow_sql = self._arrow_reader()
        self._arrow_idle: list[Any] = []
        self._arrow_lock = threading.Lock()
        self._open = OpenMetrics(self.engine, self.is_sqlite)

    # ------------------------------------------------------------------ writes
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

    def append_metrics(self, run_id: str, rows: Iterable[dict[str, Any]], event_offset: int | None = None,
                       events: Iterable[tuple[float, str, str]] = (), **run_values: Any) -> None:
        """Upsert metric rows (wide fields and open keys) and, in the same transaction, advance the run's
        event-log offset.

        Because rows and offset commit together, a crash replays exactly the lines not yet stored.
        """
        rows = list(rows)
        if len({int(r["step"]) for r in rows}) < len(rows):
            rows = merge_rows(rows)  # one parameter set per step (PostgreSQL refuses the same key twice)
        merged, rows = rows, [self._metric_values(run_id, r) for r in rows]
        with self._write_lock, Session(self.engine) as session:
            if rows and self._batch_upsert_sql:
                session.connection().exec_driver_sql(self._batch_upsert_sql, self._column_arrays(rows))
            elif rows:
                session.connection().exec_driver_sql(self._upsert_sql, [self._upsert_parameters(r) for r in rows])
            self._open.write(session.connection(), run_id, merged)
            for ts, kind, message in events:
                session.add(RunEvent(run_id=run_id, ts=ts, kind=kind, message=message))
            if event_offset is not None or run_values:
                run = session.get(Run, run_id)
                if run is not None:
                    if event_offset is not None:
                        run.event_offset = event_offset
                    if not RunStatus(run.status).is_terminal():
                        for key, value in run_values.items():
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

    # ------------------------------------------------------------------ reads
    def get_run(self, run_id: str) -> RunRecord | None:
        with Session(self.engine) as session:
            row = session.get(Run, run_id)
            return RunRecord.from_row(row) if row is not None else None

    def list_runs(self, limit: int = 500, offset: int = 0, search: str = "",
                  owners: list[str] | None = None, kinds: list[str] | None = None) -> list[RunRecord]:
        """Runs newest first, ``limit`` from ``offset``; ``search`` is a case-insensitive part of the id, name,
        model, dataset or method; ``owners``, when given, keeps the runs these users started, ``kinds`` the jobs
        of these kinds. Rows come without config_json and log_tail (read them with get_run)."""
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
                                 for column in (Run.id, Run.name, Run.model, Run.dataset, Run.method)]))

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

    def metrics_frame(self, run_id: str, from_step: int | None = None, columns: Iterable[str] | None = None,
                      keys: Iterable[str] | None = None) -> pd.DataFrame:
        """A run's metric rows in step order (those from ``from_step`` on, when given); ``columns``: only
        these wide fields after ``step`` (a page reads what it draws: less to transfer and convert). Open
        metric keys follow as one column each: ``keys`` (those of them the run logged), or every key when
        neither ``columns`` nor ``keys`` is given (the whole frame: the CSV download, the CLI's export)."""
        frame = self._wide_frame(run_id, from_step, _frame_columns(columns))
        if keys is None and columns is not None:
            return frame
        return self._open.join(frame, run_id, keys, from_step)

    def metric_keys(self, run_id: str) -> list[str]:
        """The open metric keys a run logged (besides the wide fields), sorted."""
        return self._open.keys(run_id)

    def _wide_frame(self, run_id: str, from_step: int | None, names: tuple[str, ...]) -> pd.DataFrame:
        if from_step is not None:
            return self._read_frame(run_id, from_step, None, names)
        with Session(self.engine) as session:
            state = session.exec(select(Run.status, Run.finished_at).where(Run.id == run_id)).first()
        if state is not None and state[0] in _TERMINAL_VALUES:
            # pages get their own object
            return self._finished_frame(run_id, None, state[1], names).copy(deep=False)
        return self._read_frame(run_id, None, None, names)

    def metric_rows(self, run_id: str, from_step: int | None = None) -> list[dict[str, Any]]:
        """A run's metric rows as flat dicts in step order (missing wide values None; open keys after them,
        those with a value), from ``from_step`` on when given."""
        columns = ("step", *METRIC_FIELDS)
        rows = [dict(zip(columns, row)) for row in self._read_tuples(run_id, from_step)]
        extra = self._open.by_step(run_id, from_step=from_step)
        if extra:
            for row in rows:
                row.update(extra.get(row["step"], ()))
        return rows

    def _read_frame(self, run_id: str, from_step: int | None = None, _finished_at: float | None = None,
                    columns: tuple[str, ...] = ("step", *METRIC_FIELDS)) -> pd.DataFrame:
        if from_step is None and self._arrow_connect is not None:
            frame = self._read_arrow(run_id, columns)
            if frame is not None:
                return frame
        frame = pd.DataFrame.from_records(self._read_tuples(run_id, from_step), columns=["step", *METRIC_FIELDS],
                                          coerce_float=False)
        return frame if len(columns) == len(frame.columns) else frame[list(columns)]

    def _arrow_reader(self) -> tuple[Any, str]:
        """(connect function, SQL with a {columns} slot) of the column-wise read for this backend; (None, "")
        where there is none."""
        url = self.engine.url
        if self.is_sqlite and url.database and url.database != ":memory:":
            path = url.database
            # autocommit: no transaction (a stale snapshot) held between reads
            return (lambda: adbc_sqlite.connect(path, autocommit=True)), \
                "SELECT {columns} FROM metric WHERE run_id = ? ORDER BY step"
        if not self.is_sqlite and adbc_postgresql is not None:
            uri = url.set(drivername="postgresql").render_as_string(hide_password=False)
            return (lambda: adbc_postgresql.connect(uri, autocommit=True)), \
                "SELECT {columns} FROM metric WHERE run_id = $1 ORDER BY step"
        return None, ""

    def _read_arrow(self, run_id: str, columns: tuple[str, ...] = ("step", *METRIC_FIELDS)) -> pd.DataFrame | None:
        """The run's frame read column-wise; None when the driver refused (read row by row instead)."""
        with self._arrow_lock:
            conn = self._arrow_idle.pop() if self._arrow_idle else None
        try:
            conn = conn or self._arrow_connect()
            with conn.cursor() as cursor:
                if self.is_sqlite:
                    # SQLite columns have no fixed type: ADBC infers each column's type from the first batch and
                    # fails on a later batch that disagrees (a column NULL for the first 1,024 rows, then REAL).
                    # One batch of up to a million rows lets the whole run decide (a failure reads row by row).
                    cursor.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(1 << 20)})
                cursor.execute(self._arrow_sql.format(columns=", ".join(columns)), (run_id,))  # names checked
                table = cursor.fetch_arrow_table()
        except (adbc_driver_manager.Error, OSError):
            if conn is not None:
                conn.close()  # it may be broken (a restarted server): the next read opens a fresh one
            return None
        with self._arrow_lock:
            if len(self._arrow_idle) < ARROW_IDLE_CONNECTIONS:
                self._arrow_idle.append(conn)
                conn = None
        if conn is not None:
            conn.close()
        frame = table.to_pandas()
        if frame.empty:  # no rows, so no types to infer: the row-wise read gives the usual empty frame
            return None
        return frame

    def _read_tuples(self, run_id: str, from_step: int | None) -> list[tuple]:
        # A Core select read as plain tuples: ORM objects cost ~2.5x more for a 100k-row run.
        with self.engine.connect() as conn:
            if from_step is None:
                result = conn.execute(self._frame_stmt, {"run_id": run_id})
            else:
                result = conn.execute(self._frame_from_stmt, {"run_id": run_id, "from_step": from_step})
            return result.cursor.fetchall()

    def sparklines(self, runs: list[RunRecord], max_points: int = SPARKLINE_POINTS) -> dict[str, list[float]]:
        """History's loss sparklines, stored with each run; a run recorded before they were stored gets
        its sparkline computed from its metrics once, and kept."""
        series = {r.id: json.loads(r.sparkline) for r in runs if r.sparkline is not None}
        missing = [r.id for r in runs if r.sparkline is None]
        if missing:
            computed = self.loss_series(missing, max_points)
            with self._write_lock, Session(self.engine) as session:
                for run_id, values in computed.items():
                    run = session.get(Run, run_id)
                    if run is not None and run.sparkline is None:
                        run.sparkline = json.dumps(values)
                        session.add(run)
                session.commit()
            series.update(computed)
        return series

    def loss_series(self, run_ids: list[str], max_points: int = SPARKLINE_POINTS) -> dict[str, list[float]]:
        """Train losses per run, thinned to ``max_points`` (read from the metrics: the slow way)."""
        if not run_ids:
            return {}
        with Session(self.engine) as session:
            rows = session.exec(select(Metric.run_id, Metric.loss).where(col(Metric.run_id).in_(run_ids),
                                                                        col(Metric.loss).is_not(None))
                                .order_by(Metric.run_id, Metric.step)).all()
        series: dict[str, list[float]] = {rid: [] for rid in run_ids}
        for rid, loss in rows:
            series[rid].append(loss)
        return {rid: thin(values, max_points) for rid, values in series.items()}

    # ------------------------------------------------------------------ export artifacts
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

    # ------------------------------------------------------------------ internals
    def _journal(self, run_id: str, op: str, **data: Any) -> None:
        if self.journal:
            journal.append(run_id, op, **data)

    @staticmethod
    def _metric_values(run_id: str, row: dict[str, Any]) -> dict[str, Any]:
        """One parameter set of the upsert: every column present (missing values None, merged by COALESCE)."""
        values = {"run_id": run_id, "step": int(row["step"])}
        for name in METRIC_FIELDS:
            values[name] = row.get(name)
        values["nonfinite"] = merge_nonfinite("", values["nonfinite"])  # NOT NULL; "" means "all values finite"
        return values

    @staticmethod
    def _unnest_upsert(row_sql: str) -> str:
        """The compiled one-row upsert turned into one over arrays: INSERT ... SELECT * FROM unnest(...)."""
        casts = []
        for column in Metric.__table__.columns:
            # Integers travel as floats and are cast on the server, as the one-row statement casts them.
            cast = ("FLOAT[]::INTEGER[]" if isinstance(column.type, Integer) else
                    "FLOAT[]" if isinstance(column.type, Float) else "VARCHAR[]")
            casts.append(f"%({column.name})s::{cast}")
        names = ", ".join(c.name for c in Metric.__table__.columns)
        return (f"INSERT INTO metric ({names}) SELECT * FROM unnest({', '.join(casts)})"
                + row_sql[row_sql.index(" ON CONFLICT"):])

    def _column_arrays(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Parameters of the array upsert: one list per column (numbers as floats: one type per array)."""
        arrays: dict[str, Any] = {"run_id": [r["run_id"] for r in rows], "step": [float(r["step"]) for r in rows],
                                  "nonfinite": [r["nonfinite"] for r in rows]}
        for name in METRIC_FIELDS[:-1]:  # every field but nonfinite is a number
            arrays[name] = [None if r[name] is None else float(r[name]) for r in rows]
        arrays.update(self._upsert_constants)
        return arrays

    def _upsert_parameters(self, values: dict[str, Any]) -> dict[str, Any] | tuple:
        values.update(self._upsert_constants)
        return self._upsert_order(values) if self._upsert_order else values

    def _upsert(self):
        dialect = sqlite if self.is_sqlite else postgresql
        table = Metric.__table__
        stmt = dialect.insert(table)
        updates = {name: func.coalesce(stmt.excluded[name], table.c[name]) for name in METRIC_FIELDS}
        # Union of field names: an all-finite row ("") never erases what an earlier row recorded, and a
        # NaN eval_loss arriving after a NaN loss for the same step keeps both names.
        new, old = stmt.excluded["nonfinite"], table.c["nonfinite"]
        updates["nonfinite"] = case((new == "", old), (old == "", new),
                                    (("," + old + ",").like("%," + new + ",%"), old), else_=old + "," + new)
        return stmt.on_conflict_do_update(index_elements=["run_id", "step"], set_=updates)

    # ------------------------------------------------------------------ eval results (issue 11)
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

    # ------------------------------------------------------------------ samples during training
    def append_samples(self, run_id: str, rows: Iterable[dict[str, Any]]) -> None:
        """Upsert sample answers on (run, step, index): a replayed event log rewrites the same rows."""
        values = [{"run_id": run_id, "step": int(r["step"]), "idx": int(r["index"]), "ts": float(r.get("ts") or 0.0),
                   "prompt": r["prompt"], "text": r["text"], "new_tokens": int(r.get("new_tokens") or 0),
                   "flags": json.dumps(r.get("flags") or {}, sort_keys=True), "audio": str(r.get("audio") or "")}
                  for r in rows]
        if not values:
            return
        by_key = {(v["step"], v["idx"]): v for v in values}  # PostgreSQL refuses the same key twice in one statement
        stmt = (sqlite if self.is_sqlite else postgresql).insert(Sample.__table__)
        stmt = stmt.on_conflict_do_update(index_elements=["run_id", "step", "idx"],
                                          set_={c: stmt.excluded[c] for c in ("ts", "prompt", "text", "new_tokens",
                                                                              "flags", "audio")})
        with self._write_lock, Session(self.engine) as session:
            session.connection().execute(stmt, list(by_key.values()))
            session.commit()

    def samples(self, run_id: str, max_steps: int = 50) -> list[SampleRecord]:
        """A run's sample answers of its newest ``max_steps`` sampling steps: newest step first, prompts in order."""
        with Session(self.engine) as session:
            steps = session.exec(select(Sample.step).where(Sample.run_id == run_id).distinct()
                                 .order_by(col(Sample.step).desc()).limit(max_steps)).all()
            if not steps:
                return []
            rows = session.exec(select(Sample).where(Sample.run_id == run_id, col(Sample.step) >= min(steps))
                                .order_by(col(Sample.step).desc(), Sample.idx))
            return [SampleRecord.from_row(row) for row in rows]

    def samples_from(self, run_id: str, from_step: int | None = None) -> list[SampleRecord]:
        """A run's sample answers in step order, those from ``from_step`` on when given (views kept current)."""
        query = select(Sample).where(Sample.run_id == run_id)
        if from_step is not None:
            query = query.where(col(Sample.step) >= from_step)
        with Session(self.engine) as session:
            return [SampleRecord.from_row(row) for row in session.exec(query.order_by(Sample.step, Sample.idx))]

    def sample_prompts(self, run_ids: list[str]) -> list[str]:
        """The distinct prompts these runs sampled, in the order they first appear (by run, then index)."""
        if not run_ids:
            return []
        with Session(self.engine) as session:
            rows = session.exec(select(Sample.run_id, Sample.idx, Sample.prompt).where(col(Sample.run_id).in_(run_ids))
                                .distinct()).all()
        order = {run_id: i for i, run_id in enumerate(run_ids)}
        return list(dict.fromkeys(prompt for _, _, prompt in sorted(rows, key=lambda r: (order[r[0]], r[1]))))

    def prompt_samples(self, run_ids: list[str], prompt: str) -> list[SampleRecord]:
        """Every answer these runs gave to ``prompt``: by run in the order asked for, newest step first."""
        if not run_ids:
            return []
        with Session(self.engine) as session:
            rows = session.exec(select(Sample).where(col(Sample.run_id).in_(run_ids), Sample.prompt == prompt)
                                .order_by(col(Sample.step).desc(), Sample.idx)).all()
        order = {run_id: i for i, run_id in enumerate(run_ids)}
        return sorted((SampleRecord.from_row(row) for row in rows), key=lambda r: order[r.run_id])


def _add_missing_columns(engine) -> None:
    """Columns added to any table after a database was created (create_all creates new tables but never
    alters one).

    Additive only: a new nullable or defaulted column; existing data is never touched. A new primary-key
    column cannot be added in place (such a change needs a new table)."""
    inspector = inspect(engine)
    present = set(inspector.get_table_names())
    missing = []
    for table in SQLModel.metadata.sorted_tables:
        if table.name in present:
            existing = {c["name"] for c in inspector.get_columns(table.name)}
            missing += [(table.name, c) for c in table.columns if c.name not in existing and not c.primary_key]
    if not missing:
        return
    with engine.begin() as conn:
        for table_name, column in missing:
            kind = column.type.compile(dialect=engine.dialect)
            default = column.default.arg if column.default is not None and not callable(column.default.arg) else None
            quoted = default.replace("'", "''") if isinstance(default, str) else ""
            clause = f" DEFAULT {default!r}" if isinstance(default, (int, float)) else (
                f" DEFAULT '{quoted}'" if isinstance(default, str) else "")  # old rows get the default too
            conn.execute(text(f'ALTER TABLE "{table_name}" ADD COLUMN "{column.name}" {kind}{clause}'))
        if ("run", "method_name") in {(t, c.name) for t, c in missing}:
            _fill_method_columns(conn)


def _fill_method_columns(conn) -> None:
    """Training rows from before method_name/adapter get them from their config (training_type in old ones)."""
    rows = conn.execute(text("SELECT id, config_json FROM run WHERE kind = 'train'")).all()
    for run_id, config_json in rows:
        found = training_type.pair_of_config_json(config_json)
        if found:
            conn.execute(text("UPDATE run SET method_name = :method, adapter = :adapter WHERE id = :id"),
                         {"method": found[0], "adapter": found[1], "id": run_id})


def _frame_columns(columns: Iterable[str] | None) -> tuple[str, ...]:
    """``step`` and the metric fields asked for, in table order (all of them for None)."""
    if columns is None:
        return ("step", *METRIC_FIELDS)
    wanted = set(columns) - {"step"}
    unknown = sorted(wanted - set(METRIC_FIELDS))
    if unknown:
        raise ValueError(f"columns: {', '.join(map(repr, unknown))} is not a metric field; choose from "
                         f"{', '.join(METRIC_FIELDS)}")
    return ("step", *[name for name in METRIC_FIELDS if name in wanted])


def _like_escape(text_: str) -> str:
    """``text_`` as a literal inside a LIKE pattern that uses backslash as its escape character."""
    return text_.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _add_missing_indexes(engine) -> None:
    """Indexes declared after a database was created (create_all only indexes tables it creates)."""
    for table in (Run.__table__, Metric.__table__, RunEvent.__table__):
        for index in table.indexes:
            index.create(engine, checkfirst=True)
