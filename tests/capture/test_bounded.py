"""The caps on what a long-lived gateway keeps per session."""

from __future__ import annotations

import pytest
from tracetap.capture.bounded import LruDict, RecentSet
from tracetap.capture.service import MAX_REGISTERED, GatewayService
from tracetap.store import StoreWriter


def test_lru_dict_keeps_the_most_recently_used():
    cache: LruDict[str, int] = LruDict(3)
    for n, key in enumerate("abc"):
        cache[key] = n
    assert cache.get("a") == 0  # a is now the most recent
    cache["d"] = 3
    assert "b" not in cache and len(cache) == 3
    assert [cache.get(key) for key in "acd"] == [0, 2, 3]
    assert cache.setdefault("e", lambda: 4) == 4 and cache.setdefault("e", lambda: 5) == 4
    assert "a" not in cache and cache.pop("e") == 4 and cache.pop("missing") is None


def test_lru_dict_needs_room():
    with pytest.raises(ValueError):
        LruDict(0)


def test_recent_set_never_grows_past_its_cap():
    recent: RecentSet[str] = RecentSet(100)
    for n in range(10_000):
        recent.add(f"s{n}")
        assert len(recent) <= 100
    assert "s9999" in recent and "s9900" in recent and "s9899" not in recent
    recent.discard("s9999")
    recent.discard("never-added")
    assert "s9999" not in recent


def test_the_services_registered_ids_are_capped(tmp_path):
    with StoreWriter(tmp_path / "store") as writer:
        service = GatewayService(writer=writer, upstream=None)
        for n in range(MAX_REGISTERED + 500):
            service.registered.add(f"run-{n}")
    assert len(service.registered) == MAX_REGISTERED
    assert f"run-{MAX_REGISTERED + 499}" in service.registered and "run-0" not in service.registered
