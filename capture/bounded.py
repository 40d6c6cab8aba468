"""Per-session memory a long-lived gateway keeps, with a cap: the least recently used entries go
first, so a gateway that has seen a million sessions holds what the recent ones need."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruDict(Generic[K, V]):
    """A mapping of at most `cap` entries; reading or writing an entry makes it the most recent."""

    def __init__(self, cap: int):
        if cap < 1:
            raise ValueError("an LruDict needs room for at least one entry")
        self.cap = cap
        self._items: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: K, default: V | None = None) -> V | None:
        if key not in self._items:
            return default
        self._items.move_to_end(key)
        return self._items[key]

    def setdefault(self, key: K, make: Callable[[], V]) -> V:
        """The entry for `key`, made by `make()` when there is none."""
        if key not in self._items:
            self[key] = make()
        self._items.move_to_end(key)
        return self._items[key]

    def __setitem__(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.cap:
            self._items.popitem(last=False)

    def pop(self, key: K, default: V | None = None) -> V | None:
        return self._items.pop(key, default)


class RecentSet(Generic[K]):
    """The `cap` most recently added keys."""

    def __init__(self, cap: int):
        self._keys: LruDict[K, None] = LruDict(cap)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def add(self, key: K) -> None:
        self._keys[key] = None

    def discard(self, key: K) -> None:
        self._keys.pop(key)
