"""The Ray cluster an admin saved in Settings (its address and the shared storage path), as this process knows it.

The values live in the database (db/settings_store.py); the store of this process's database registers a reader
here when it opens, and the readers of the server's Ray settings (config ``ray_address_problem``, the Ray
launcher's ``server_addresses`` and ``shared_storage``) ask ``saved()``. A process without a store (a worker, a
Ray job) has nothing saved and uses its environment only. Answers are kept for a few seconds: New run asks on every
rerun, and another dashboard or the CLI may save meanwhile.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

FRESH_S = 2.0  # how long an answer is reused before the database is asked again


@dataclass(frozen=True)
class SavedCluster:
    address: str = ""  # the cluster's dashboard address (never with a user and password)
    shared_storage: str = ""  # the path every node mounts
    saved_by: str = ""
    saved_at: float | None = None  # UNIX seconds

    def __bool__(self) -> bool:
        return bool(self.address or self.shared_storage)


NOTHING = SavedCluster()
_lock = threading.Lock()
_reader: tuple[Callable[[], SavedCluster], Callable[[], bool]] | None = None
_answer: tuple[float, SavedCluster] | None = None


def register(read: Callable[[], SavedCluster], current: Callable[[], bool]) -> None:
    """Read saved settings with ``read`` while ``current()`` says its database is still this process's (a test, or
    a rebuild, may point the process at another data root)."""
    global _reader, _answer
    with _lock:
        _reader, _answer = (read, current), None


def saved() -> SavedCluster:
    """What Settings saved, or NOTHING (no store in this process, nothing saved, or a database that cannot be read:
    the environment still works)."""
    global _answer
    with _lock:
        reader, answer = _reader, _answer
    if reader is None or not reader[1]():
        return NOTHING
    now = time.monotonic()
    if answer is not None and now - answer[0] < FRESH_S:
        return answer[1]
    try:
        found = reader[0]()
    except Exception:  # noqa: BLE001 - a broken database is Settings' message to give; runs use the environment
        found = NOTHING
    with _lock:
        _answer = (now, found)
    return found


def forget() -> None:
    """Ask the database again at the next ``saved()`` (after this process saved or cleared)."""
    global _answer
    with _lock:
        _answer = None
