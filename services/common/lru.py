"""A least-recently-used map bounded by the total size of its values (the learner's cache of image
features, the rollout service's cache of decoded frames)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SizedLRU(Generic[K, V]):
    """Values of at most `max_bytes` in all, as `size` counts them; the least recently used go first.
    A value larger than the whole budget is not kept."""

    def __init__(self, max_bytes: int, size: Callable[[V], int]) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._size = size
        self._entries: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        """The value under `key`, now the most recently used; None when it is not kept."""
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Keeps `value` under `key` as the most recently used, evicting the least recently used
        values until it fits."""
        size = self._size(value)
        if size > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.num_bytes -= self._size(old)
        while self.num_bytes + size > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.num_bytes -= self._size(evicted)
        self._entries[key] = value
        self.num_bytes += size
