"""Schema changes after a database was created: columns and indexes added in place (create_all creates new tables
but never alters one), and the method columns of rows from before method/adapter were separate. A new table (the
saved settings, db/settings_store.py) needs nothing here: the store's create_all adds it, empty, to an older
database."""
from __future__ import annotations


from sqlalchemy import inspect, text
from sqlmodel import SQLModel

from db.models import Metric, Run, RunEvent
from trainer_core.protocol import training_type


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


def _add_missing_indexes(engine) -> None:
    """Indexes declared after a database was created (create_all only indexes tables it creates)."""
    for table in (Run.__table__, Metric.__table__, RunEvent.__table__):
        for index in table.indexes:
            index.create(engine, checkfirst=True)
