"""Settings an admin saves on the Settings page: the Ray cluster's address and the shared storage path.

The database is a cache of the run folders (DESIGN rule 12), and settings are the exception: no run folder records
them, so they live only here, like users and API tokens, and ``db rebuild`` carries them over from the database it
sets aside (``read_settings`` / ``restore_settings``). Never a secret: an address with a user and password is
refused before it gets here (trainer_core/launchers/ray_settings.py), credentials stay in the server's environment.

A database from before this table gets it when the store opens it (``create_all`` creates missing tables), empty:
nothing saved, the server's environment alone.
"""
from __future__ import annotations

import time

from sqlalchemy import create_engine, inspect
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, delete, select

from db.models import Setting
from trainer_core.protocol import cluster_settings
from trainer_core.protocol.cluster_settings import SavedCluster

RAY_ADDRESS, SHARED_STORAGE = "ray.address", "ray.shared_storage"  # the keys of the Ray cluster's rows


def read_cluster(engine) -> SavedCluster:
    """The saved Ray cluster (empty when nothing is saved)."""
    with Session(engine) as session:
        rows = {row.key: row for row in session.exec(select(Setting).where(Setting.key.in_([RAY_ADDRESS,
                                                                                              SHARED_STORAGE])))}
    if not rows:
        return cluster_settings.NOTHING
    first = next(iter(rows.values()))
    return SavedCluster(rows[RAY_ADDRESS].value if RAY_ADDRESS in rows else "",
                        rows[SHARED_STORAGE].value if SHARED_STORAGE in rows else "", first.saved_by, first.saved_at)


def save_cluster(store, address: str, shared_storage: str, by: str) -> SavedCluster:
    """Save both values in one transaction (checked before: Settings saves only what passed the cluster check)."""
    now = time.time()
    with store._write_lock, Session(store.engine) as session:
        for key, value in ((RAY_ADDRESS, address), (SHARED_STORAGE, shared_storage)):
            session.merge(Setting(key=key, value=value, saved_by=by, saved_at=now))
        session.commit()
    cluster_settings.forget()
    return SavedCluster(address, shared_storage, by, now)


def clear_cluster(store) -> bool:
    """Remove the saved Ray cluster; False when nothing was saved."""
    with store._write_lock, Session(store.engine) as session:
        result = session.exec(delete(Setting).where(Setting.key.in_([RAY_ADDRESS, SHARED_STORAGE])))
        session.commit()
    cluster_settings.forget()
    return bool(result.rowcount)


def serve(store, current) -> None:
    """Make ``store``'s saved cluster this process's (``cluster_settings.saved()``) while ``current()`` holds."""
    cluster_settings.register(lambda: read_cluster(store.engine), current)


def read_settings(url: str) -> list[dict] | None:
    """Every saved setting of the database at ``url``, read without changing it; None when it cannot be read. A
    database from before the table has none."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table(Setting.__tablename__):
                return []
            return [dict(r._mapping) for r in conn.execute(Setting.__table__.select())]
    except SQLAlchemyError:
        return None
    finally:
        engine.dispose()


def restore_settings(store, rows: list[dict]) -> None:
    """Write ``rows`` (``read_settings``) into a rebuilt database."""
    with store._write_lock, Session(store.engine) as session:
        for row in rows:
            session.merge(Setting(**row))
        session.commit()
    cluster_settings.forget()
