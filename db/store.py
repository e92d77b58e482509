"""The store: the one write path to the database.

SQLite (WAL) under the data root by default; ``DATABASE_URL`` switches to PostgreSQL. Metrics are
upserted on (run_id, step) and merged field by field, so an eval row and a train row for the same
step become one row, and replaying events after a re-attach never duplicates anything. Open metric keys
(any key besides the wide columns) go to a long table on (run_id, step, key) in the same transaction
(db/metrics_store.py).

The Store is one object over one engine; its methods live with their aggregate: runs and the queue
(db/runs_store.py), metrics (db/metric_frames.py), eval results (db/evals_store.py), samples (db/samples_store.py), people's votes and ratings
(db/feedback_store.py);
schema changes in db/migrations.py.
"""
from __future__ import annotations

import functools
import operator
import os
import threading
from typing import Any

from sqlalchemy import bindparam
from sqlalchemy import event as sa_event
from sqlmodel import SQLModel, create_engine, select

from db.evals_store import EvalsStore
from db.feedback_store import FeedbackStore
from db.metric_frames import SPARKLINE_POINTS, MetricsStore
from db.metrics_store import OpenMetrics
from db.migrations import _add_missing_columns, _add_missing_indexes
from db.runs_store import RunsStore
from db.models import Metric
from db.samples_store import SamplesStore
from db import settings_store
from trainer_core.protocol import paths
from trainer_core.protocol.metrics import METRIC_FIELDS

__all__ = ["SPARKLINE_POINTS", "Store", "default_url"]  # SPARKLINE_POINTS: where readers have always found it
FINISHED_FRAMES_CACHED = 12  # metric frames of finished runs kept in memory (a 100k-step frame is ~10 MB)


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


class Store(RunsStore, MetricsStore, EvalsStore, SamplesStore, FeedbackStore):
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
        if self.url == default_url():  # this process's database: its saved Ray cluster is the one in force
            settings_store.serve(self, lambda url=self.url: default_url() == url)
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
