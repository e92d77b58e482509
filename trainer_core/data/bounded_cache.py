"""The one in-memory cache of the dashboard: least recently used entries go first, thread-safe.

Parsed dataset files, dataset checks and data previews are cached for the reruns of a page, and the
orchestrator keeps live views of finished runs and of runs pumped elsewhere; each cache
is bounded by its number of entries and, where entries differ a lot in size, by their total weight
(e.g. file bytes), because a few large files must not pin gigabytes of Python objects in the server.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """At most ``max_items`` entries and (with ``weight``) at most ``max_weight`` in total.

    The newest entry is always kept, even when it alone weighs more than ``max_weight``: the caller
    just computed it and is about to use it again on the next rerun."""

    def __init__(self, max_items: int, max_weight: float | None = None,
                 weight: Callable[[K, V], float] | None = None):
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        if (max_weight is None) != (weight is None):
            raise ValueError("give both max_weight and weight, or neither")
        self.max_items = max_items
        self.max_weight = max_weight
        self._weight = weight
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._total = 0.0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The cached value (now the most recently used), or None."""
        with self._lock:
            if key not in self._entries:
                return None
            self._entries.move_to_end(key)
            return self._entries[key]

    def put(self, key: K, value: V) -> None:
        with self._lock:
            if key in self._entries:
                self._total -= self._weigh(key, self._entries.pop(key))
            self._entries[key] = value
            self._total += self._weigh(key, value)
            while len(self._entries) > 1 and (len(self._entries) > self.max_items or self._too_heavy()):
                old_key, old_value = self._entries.popitem(last=False)
                self._total -= self._weigh(old_key, old_value)

    def pop(self, key: K) -> V | None:
        """Drop ``key`` (e.g. its data changed); its value, or None when it was not cached."""
        with self._lock:
            if key not in self._entries:
                return None
            value = self._entries.pop(key)
            self._total -= self._weigh(key, value)
            return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._total = 0.0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def _weigh(self, key: K, value: V) -> float:
        return self._weight(key, value) if self._weight else 0.0

    def _too_heavy(self) -> bool:
        return self.max_weight is not None and self._total > self.max_weight
