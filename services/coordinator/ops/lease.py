"""Run leases in Redis: one coordinator drives a run at a time.

`mmrl:run:<id>:lease` holds the id of the coordinator driving the run and expires `ttl_s` after
its last renewal. A coordinator takes a run only by acquiring its lease (free, expired, or already
its own: a coordinator restarted under the same id takes its runs back at once), renews the leases
of the runs it drives every ttl/3, and stops driving a run whose lease another coordinator holds.
When a coordinator dies, its leases expire and another one adopts the runs (RunManager.maintain).
"""

from __future__ import annotations

import os
import socket
from typing import Any

from services.coordinator.ops.store import PREFIX

# Take the lease when it is free or ours (extending it), else answer 0: one round trip, atomic.
_ACQUIRE = """
local holder = redis.call('GET', KEYS[1])
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def default_owner() -> str:
    """This coordinator's id: host name and API port (stable across a restart in place)."""
    return f"{socket.gethostname()}:{os.environ.get('MMRL_COORDINATOR_PORT', '8000')}"


class Leases:
    def __init__(self, redis: Any, owner: str, ttl_s: float) -> None:
        assert ttl_s > 0
        self.r = redis
        self.owner = owner
        self.ttl_ms = int(ttl_s * 1000)

    @staticmethod
    def key(run_id: str) -> str:
        return f"{PREFIX}run:{run_id}:lease"

    async def acquire(self, run_id: str) -> bool:
        """Takes or renews the run's lease; False when another coordinator holds it."""
        return bool(await self.r.eval(_ACQUIRE, 1, self.key(run_id), self.owner, self.ttl_ms))

    renew = acquire  # the same check: ours or free -> ours for another ttl

    async def release(self, run_id: str) -> None:
        """Gives the lease up if this coordinator holds it."""
        await self.r.eval(_RELEASE, 1, self.key(run_id), self.owner)

    async def holder(self, run_id: str) -> str:
        """The coordinator driving the run ('' when none does)."""
        return str(await self.r.get(self.key(run_id)) or "")
