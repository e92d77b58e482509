"""SQL validators' query check: a generated query must run, reading only, against a fresh in-memory SQLite database
built from the recipe's ``schema_sql``.

SQLite's authorizer allows the query to select, read tables and call functions, and nothing else: an INSERT, a DROP,
an ATTACH (VACUUM INTO a file is one), a PRAGMA or a transaction is refused, and the row's reason says what it would
have done. Each database is new, so no query sees another's effects. A progress handler stops a query (or the schema)
past SQL_TIME_LIMIT_S, and strings and blobs are capped at SQL_MAX_LENGTH bytes.
"""
from __future__ import annotations

import sqlite3
import time
from typing import Any

SQL_TIME_LIMIT_S = 2.0  # per query (and for schema_sql): a join that runs away is a failed row, not a stuck job
SQL_MAX_LENGTH = 10_000_000  # bytes in one SQLite string or blob: zeroblob(1e9) would hold a gigabyte
_READS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
                    getattr(sqlite3, "SQLITE_RECURSIVE", 33)})  # 33: WITH RECURSIVE (the constant is Python 3.11+)
_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_temp_master", "sqlite_schema", "sqlite_temp_schema"})


def database(schema_sql: str) -> sqlite3.Connection:
    """A fresh in-memory database built from ``schema_sql`` (no ATTACH, no VACUUM INTO a file; time limited)."""
    connection = sqlite3.connect(":memory:")
    _time_limit(connection)
    attached = []

    def no_files(action: int, *_: Any) -> int:
        if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
            attached.append(action)
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    connection.set_authorizer(no_files)
    try:
        connection.executescript(schema_sql)
    except BaseException as exc:  # closed, then raised (saying why, when ATTACH was refused)
        connection.close()
        if attached and isinstance(exc, sqlite3.Error):
            raise sqlite3.DatabaseError("ATTACH, DETACH and VACUUM INTO are not allowed: the database is built in "
                                        "memory from this SQL alone") from exc
        raise
    return connection


def _time_limit(connection: sqlite3.Connection) -> None:
    deadline = time.monotonic() + SQL_TIME_LIMIT_S
    connection.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)  # non-zero interrupts the query
    if hasattr(connection, "setlimit"):  # Python 3.11+
        connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, SQL_MAX_LENGTH)


def query_problem(schema_sql: str, query: str) -> str | None:
    """Why ``query`` fails against a fresh database built from ``schema_sql``, or None; only reading is allowed."""
    denied: list[tuple[int, str | None]] = []

    def reads_only(action: int, table: str | None, *_: Any) -> int:
        if action in _READS:
            return sqlite3.SQLITE_OK
        denied.append((action, table))
        return sqlite3.SQLITE_DENY

    try:
        connection = database(schema_sql)
    except sqlite3.Error as exc:  # it ran when the recipe was checked: only a time limit on a loaded host fails here
        return f"the validator's schema_sql did not build ({exc})"
    try:
        _time_limit(connection)  # a fresh deadline for the query itself
        connection.set_authorizer(reads_only)
        cursor = connection.execute(query)
        if cursor.description is None:
            return "not a query: give one SELECT (or WITH ... SELECT) statement"
        for _ in cursor:  # SQLite computes rows as they are read: a query's error may come on its last row
            pass
    except sqlite3.Error as exc:
        if denied:
            return f"only read queries (SELECT or WITH) may run: this one would {_action(*denied[0])}"
        if str(exc) == "interrupted":  # by the progress handler, past the deadline
            return f"took longer than {SQL_TIME_LIMIT_S:g} s and was stopped"
        return f"does not execute ({exc})"
    except (ValueError, OverflowError) as exc:  # e.g. "the query contains a null character"
        return f"does not execute ({exc})"
    finally:
        connection.close()
    return None


def _action(action: int, table: str | None) -> str:
    if table in _SCHEMA_TABLES:
        return "change the schema"
    words = {sqlite3.SQLITE_INSERT: "insert into", sqlite3.SQLITE_UPDATE: "update", sqlite3.SQLITE_DELETE:
             "delete from", sqlite3.SQLITE_ATTACH: "attach a database", sqlite3.SQLITE_DETACH: "detach a database",
             sqlite3.SQLITE_PRAGMA: "run a PRAGMA", sqlite3.SQLITE_TRANSACTION: "begin or end a transaction"}
    word = words.get(action, "change the database")
    return f"{word} {table}" if action in (sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE) \
        and table else word
