"""trainer_core.data.bounded_cache: least recently used entries go first, by count and by weight."""
from __future__ import annotations

import pytest

from trainer_core.data.bounded_cache import BoundedCache


def test_the_least_recently_used_entry_goes_first():
    cache: BoundedCache[str, int] = BoundedCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recently used
    cache.put("c", 3)
    assert ("a" in cache, "b" in cache, "c" in cache) == (True, False, True)
    assert cache.get("b") is None
    assert len(cache) == 2


def test_weight_bounds_the_total_but_keeps_the_newest_entry():
    cache: BoundedCache[tuple[str, int], str] = BoundedCache(10, max_weight=100, weight=lambda key, value: key[1])
    cache.put(("small", 40), "s")
    cache.put(("medium", 50), "m")
    cache.put(("large", 30), "l")  # 120 in total: the oldest goes
    assert [k in cache for k in (("small", 40), ("medium", 50), ("large", 30))] == [False, True, True]
    cache.put(("huge", 500), "h")  # heavier than the bound alone: kept, everything else goes
    assert len(cache) == 1 and cache.get(("huge", 500)) == "h"


def test_replacing_a_key_reweighs_it():
    cache: BoundedCache[str, int] = BoundedCache(10, max_weight=10, weight=lambda key, value: value)
    cache.put("a", 6)
    cache.put("a", 2)
    cache.put("b", 8)  # 2 + 8 = 10: both fit only if the old weight of "a" was taken off
    assert (cache.get("a"), cache.get("b")) == (2, 8)
    cache.clear()
    assert len(cache) == 0 and cache.get("a") is None


def test_bounds_are_checked():
    with pytest.raises(ValueError, match="max_items"):
        BoundedCache(0)
    with pytest.raises(ValueError, match="both"):
        BoundedCache(2, max_weight=10)


def test_pop_drops_an_entry_and_its_weight():
    cache: BoundedCache[str, int] = BoundedCache(10, max_weight=10, weight=lambda key, value: value)
    cache.put("a", 6)
    assert cache.pop("a") == 6 and "a" not in cache
    assert cache.pop("a") is None
    cache.put("b", 10)  # fits only if the weight of "a" went with it
    assert cache.get("b") == 10 and len(cache) == 1
