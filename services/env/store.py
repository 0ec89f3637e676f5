"""A bounded store of live episodes that forgets idle ones.

Episodes are kept in least-recently-used order, so expiry pops from the front and costs O(1) per
expired episode. Expiry runs lazily on every operation (no background task needed: nothing but a
request can observe the store). Ids of closed and expired episodes are remembered (bounded) only to
say why an id is not found.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from services.common.messages import shown

T = TypeVar("T")


class EpisodeStore(Generic[T]):
    """Live items by id, at most `max_live`, each forgotten after `idle_ttl_s` without use."""

    def __init__(
        self,
        max_live: int,
        idle_ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        num_remembered_gone: int = 65536,
    ) -> None:
        assert max_live >= 1 and idle_ttl_s > 0
        self.max_live = max_live
        self.idle_ttl_s = idle_ttl_s
        self._clock = clock
        self._num_remembered_gone = num_remembered_gone
        self._live: OrderedDict[str, tuple[T, float]] = OrderedDict()  # id -> (item, last use)
        self._gone: OrderedDict[str, str] = OrderedDict()  # id -> "closed" | "expired"
        self.num_expired = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, episode_id: object) -> bool:
        return episode_id in self._live

    def __iter__(self) -> Iterator[str]:
        return iter(self._live)

    def expire(self) -> int:
        """Forgets every item idle for longer than the TTL; returns how many."""
        deadline = self._clock() - self.idle_ttl_s
        num_expired = 0
        while self._live:
            episode_id, (_, last_use) = next(iter(self._live.items()))
            if last_use > deadline:
                break
            del self._live[episode_id]
            self._remember_gone(episode_id, "expired")
            num_expired += 1
        self.num_expired += num_expired
        return num_expired

    def free_slots(self) -> int:
        """How many items can be added now (after expiring idle ones)."""
        self.expire()
        return self.max_live - len(self._live)

    def add(self, episode_id: str, item: T) -> None:
        assert episode_id not in self._live, episode_id
        if len(self._live) >= self.max_live:
            raise OverflowError(f"store is full ({self.max_live} live items)")
        self._live[episode_id] = (item, self._clock())

    def get(self, episode_id: str) -> T | None:
        """The live item, or None (unknown, closed or expired). Does not count as use."""
        entry = self._live.get(episode_id)
        return None if entry is None else entry[0]

    def touch(self, episode_id: str) -> None:
        """Marks the item as used now."""
        item, _ = self._live[episode_id]
        self._live[episode_id] = (item, self._clock())
        self._live.move_to_end(episode_id)

    def close(self, episode_id: str) -> bool:
        """Forgets the item; False when it was not live."""
        if self._live.pop(episode_id, None) is None:
            return False
        self._remember_gone(episode_id, "closed")
        return True

    def why_missing(self, episode_id: str) -> str:
        """Why `episode_id` is not live, for a NOT_FOUND message."""
        reason = self._gone.get(episode_id)
        if reason == "expired":
            return f"episode {shown(episode_id)} expired (idle for more than {self.idle_ttl_s:g} s)"
        if reason == "closed":
            return f"episode {shown(episode_id)} was closed"
        return f"unknown episode {shown(episode_id)}"

    def _remember_gone(self, episode_id: str, reason: str) -> None:
        self._gone[episode_id] = reason
        while len(self._gone) > self._num_remembered_gone:
            self._gone.popitem(last=False)
