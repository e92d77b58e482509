"""Open metrics: the long table (run, step, key, value) beside the wide ``metric`` table (DESIGN rule 15).

A metric row is one flat dict per step (trainer_core.protocol.metrics): the wide fields go to ``metric``, every
other key to ``metricvalue``. ``Store.append_metrics`` writes both with the event-log offset in one
transaction through ``write``; reads come back as one column per key next to the wide columns, so Live, Run
details, Compare, the CSV download and ``db rebuild`` see every key without a schema change.
"""
from __future__ import annotations

from typing import Any, Iterable

import pandas as pd
from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection, Engine

from db.models import MetricValue
from trainer_core.protocol.metrics import WIDE_NAMES

_COLUMNS = MetricValue.__table__.c


class OpenMetrics:
    """Writes and reads of the long table; the caller (the Store) holds the write lock and the transaction."""

    def __init__(self, engine: Engine, is_sqlite: bool):
        self.engine = engine
        self.is_sqlite = is_sqlite
        # A later value of the same (run, step, key) replaces the earlier one (a replayed log writes the same
        # value again). Rows carry finite values only: nothing to merge, unlike the wide columns' COALESCE.
        conflict = " ON CONFLICT (run_id, step, key) DO UPDATE SET value = excluded.value"
        if is_sqlite:
            self._upsert_sql = "INSERT INTO metricvalue (run_id, key, step, value) VALUES (?, ?, ?, ?)" + conflict
        else:  # the whole batch as one statement over one array per column, as the wide upsert does
            self._upsert_sql = ("INSERT INTO metricvalue (run_id, key, step, value) SELECT * FROM unnest("
                                "%(run_id)s::VARCHAR[], %(key)s::VARCHAR[], %(step)s::INTEGER[], %(value)s::FLOAT[])"
                                + conflict)
        base = select(_COLUMNS.step, _COLUMNS.key, _COLUMNS.value).where(_COLUMNS.run_id == bindparam("run_id"))
        self._keys_stmt = (select(_COLUMNS.key).where(_COLUMNS.run_id == bindparam("run_id")).distinct()
                           .order_by(_COLUMNS.key))
        self._all_stmt = base.order_by(_COLUMNS.step, _COLUMNS.key)
        self._some_stmt = base.where(_COLUMNS.key.in_(bindparam("keys", expanding=True))).order_by(
            _COLUMNS.step, _COLUMNS.key)

    # ------------------------------------------------------------------ writes
    def write(self, conn: Connection, run_id: str, rows: Iterable[dict[str, Any]]) -> None:
        """Upsert the open keys of metric rows (one row per step: the caller merged them) on ``conn``."""
        values = [(run_id, key, int(row["step"]), float(value)) for row in rows for key, value in row.items()
                  if key not in WIDE_NAMES and value is not None]
        if not values:
            return
        if self.is_sqlite:
            conn.exec_driver_sql(self._upsert_sql, values)
        else:
            run_ids, keys, steps, numbers = (list(column) for column in zip(*values))
            conn.exec_driver_sql(self._upsert_sql, {"run_id": run_ids, "key": keys, "step": steps, "value": numbers})

    # ------------------------------------------------------------------ reads
    def keys(self, run_id: str) -> list[str]:
        """The open metric keys a run has logged, sorted."""
        with self.engine.connect() as conn:
            return [key for (key,) in conn.execute(self._keys_stmt, {"run_id": run_id})]

    def by_step(self, run_id: str, keys: Iterable[str] | None = None, from_step: int | None = None
                ) -> dict[int, dict[str, float]]:
        """step -> {key: value} of ``keys`` (None: every key), from ``from_step`` on when given."""
        out: dict[int, dict[str, float]] = {}
        for step, key, value in self._read(run_id, keys, from_step):
            out.setdefault(step, {})[key] = value
        return out

    def join(self, frame: pd.DataFrame, run_id: str, keys: Iterable[str] | None = None,
             from_step: int | None = None) -> pd.DataFrame:
        """``frame`` (the wide columns, with ``step``) with one more column per open key (``keys``, or every
        key the run has when None) that has values; the frame itself when there are none."""
        rows = self._read(run_id, keys, from_step)
        if not rows:
            return frame
        long = pd.DataFrame(rows, columns=["step", "key", "value"])
        wide = long.pivot(index="step", columns="key", values="value")
        order = list(dict.fromkeys(keys)) if keys is not None else sorted(wide.columns)
        wide = wide[[k for k in order if k in wide.columns]]
        wide.columns.name = None
        # Every step with open values also has its wide row (both are written from the same event)
        return frame.merge(wide, how="left", left_on="step", right_index=True)

    def _read(self, run_id: str, keys: Iterable[str] | None, from_step: int | None) -> list[tuple]:
        if keys is not None:
            keys = [k for k in dict.fromkeys(keys) if k not in WIDE_NAMES]
            if not keys:
                return []
            stmt, params = self._some_stmt, {"run_id": run_id, "keys": keys}
        else:
            stmt, params = self._all_stmt, {"run_id": run_id}
        if from_step is not None:
            stmt = stmt.where(_COLUMNS.step >= from_step)
        with self.engine.connect() as conn:
            return list(conn.execute(stmt, params))
