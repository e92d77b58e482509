"""Metrics: the upsert of a batch of rows with its event-log offset in one transaction, and the frames, keys and
sparklines read back (the Store's metric aggregate; db/store.py composes it, db/metrics_store.py holds the long
table of open keys).

Rows are upserted on (run_id, step) and merged field by field; whole frames are read column-wise through ADBC into
Arrow where the driver is installed, row by row otherwise, and a finished run's frame is cached."""
from __future__ import annotations

import json
from typing import Any, Iterable

import adbc_driver_manager
import adbc_driver_sqlite.dbapi as adbc_sqlite
import pandas as pd
from sqlalchemy import Float, Integer, case, func
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from db.entities import RunRecord
from db.models import Metric, Run, RunEvent
from trainer_core.protocol.metrics import METRIC_FIELDS, merge_nonfinite, merge_rows, thin
from trainer_core.protocol.status import RunStatus

SPARKLINE_POINTS = 60
ARROW_IDLE_CONNECTIONS = 4  # column-wise (ADBC) read connections kept open between reads
try:  # the PostgreSQL extra; without it PostgreSQL frames are read row by row (slower, the same frames)
    import adbc_driver_postgresql.dbapi as adbc_postgresql
except ImportError:
    adbc_postgresql = None
_TERMINAL_VALUES = tuple(s.value for s in RunStatus if s.is_terminal())
_BEFORE_STOPPING = (RunStatus.QUEUED.value, RunStatus.STARTING.value, RunStatus.RUNNING.value)


class MetricsStore:
    """Store methods on metric; ``self`` is the Store (engine, write lock, backend)."""

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
                        if run.status == RunStatus.STOPPING.value and run_values.get("status") in _BEFORE_STOPPING:
                            # a status read before Stop/Cancel was written, flushed after: the request stands
                            run_values = {k: v for k, v in run_values.items() if k not in ("status", "phase")}
                        for key, value in run_values.items():
                            setattr(run, key, value)
                    session.add(run)
            session.commit()

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
