"""The run queue's scheduling in Redis: which queued run starts next, on which learner pool.

A learner pool (one learner service with its ranks, named by its rank 0's host:port) holds one run
at a time. `mmrl:learner:<host:port>` names the run holding it; the claim is valid only while that
run is pending or running with that learner recorded on it, so a run that ended, paused or went
back to the queue frees its pool whatever became of the key (a coordinator that died before
releasing it leaves nothing stuck). Each script below reads and writes in one step (a Lua script
runs atomically), so of two coordinators one takes a queued run and the other sees it gone, and two
runs never take one pool.

`take` walks the queue in order (priority, then the order runs joined it: store.queue_score) and
starts the first run that fits: a free pool among those it may use (its config's
`endpoints.learner`, else every configured pool) and its tenant under `max_running`. A run that
does not fit waits without holding up the runs behind it that do. Taking a run marks it pending on
its pool, removes it from the queue, records the state event and gives the caller the run's lease
(lease.py), all at once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from services.coordinator.ops.lease import Leases
from services.coordinator.ops.store import EVENTS_MAXLEN, PREFIX, QUEUE

LEARNERS = f"{PREFIX}learners"

# The run holding a learner (false when none validly does); shared by the scripts below.
_HOLDER = """
local function holder(learner)
  local run = redis.call('GET', 'mmrl:learner:' .. learner)
  if not run then return false end
  local f = redis.call('HMGET', 'mmrl:run:' .. run, 'state', 'learner')
  if (f[1] == 'pending' or f[1] == 'running') and f[2] == learner then return run end
  return false
end
local function tenant_of(run)
  local t = redis.call('HGET', 'mmrl:run:' .. run, 'tenant')
  if not t or t == '' then return 'default' end
  return t
end
"""

# KEYS: queue, learners. ARGV: owner, lease ttl (ms), now (s), events maxlen, JSON {pools, max_running,
# default_max_running}. Returns {run id, learner} or false.
_TAKE = _HOLDER + """
local args = cjson.decode(ARGV[5])
local busy, running = {}, {}
local function is_busy(learner)
  if busy[learner] == nil then
    local run = holder(learner)
    busy[learner] = run and true or false
    if run then
      local t = tenant_of(run)
      running[t] = (running[t] or 0) + 1
    end
  end
  return busy[learner]
end
for _, learner in ipairs(redis.call('SMEMBERS', KEYS[2])) do is_busy(learner) end
for _, learner in ipairs(args.pools) do is_busy(learner) end
for _, run in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local key = 'mmrl:run:' .. run
  local f = redis.call('HMGET', key, 'state', 'config')
  if f[1] ~= 'queued' then
    redis.call('ZREM', KEYS[1], run)
  else
    local tenant = tenant_of(run)
    local limit = args.max_running[tenant] or args.default_max_running
    local lease = redis.call('GET', key .. ':lease')
    if (limit == 0 or (running[tenant] or 0) < limit) and (not lease or lease == ARGV[1]) then
      local ok, config = pcall(cjson.decode, f[2] or '')
      local pin = ok and type(config) == 'table' and type(config.endpoints) == 'table'
        and config.endpoints.learner or ''
      local candidates = args.pools
      if type(pin) == 'string' and pin ~= '' then candidates = {pin} end
      for _, learner in ipairs(candidates) do
        if not is_busy(learner) then
          redis.call('SET', 'mmrl:learner:' .. learner, run)
          redis.call('SADD', KEYS[2], learner)
          redis.call('HSET', key, 'state', 'pending', 'learner', learner, 'failure_reason', '',
                     'updated_at', ARGV[3])
          redis.call('ZREM', KEYS[1], run)
          redis.call('SET', key .. ':lease', ARGV[1], 'PX', ARGV[2])
          redis.call('XADD', key .. ':events', 'MAXLEN', '~', ARGV[4], '*', 'kind', 'state', 'data',
                     '{"state": "pending", "reason": "", "learner": ' .. cjson.encode(learner) .. '}',
                     'ts', ARGV[3])
          return {run, learner}
        end
      end
    end
  end
end
return false
"""

# KEYS: learner:<addr>, learners. ARGV: run id, learner. Returns '' when the run holds the learner
# now, else the run that holds it.
_CLAIM = _HOLDER + """
local current = holder(ARGV[2])
if current and current ~= ARGV[1] then return current end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('HSET', 'mmrl:run:' .. ARGV[1], 'learner', ARGV[2])
return ''
"""

# KEYS: learner:<addr>. ARGV: run id. Deletes the claim once the run no longer holds the learner.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local state = redis.call('HGET', 'mmrl:run:' .. ARGV[1], 'state')
  if state ~= 'pending' and state ~= 'running' then return redis.call('DEL', KEYS[1]) end
end
return 0
"""


def learner_key(learner: str) -> str:
    return f"{PREFIX}learner:{learner}"


class Scheduler:
    """Takes queued runs onto free learner pools for the coordinator whose leases are `leases`."""

    def __init__(self, redis: Any, leases: Leases) -> None:
        self.r = redis
        self.leases = leases

    async def take(self, pools: Sequence[str], max_running: Mapping[str, int] | None = None,
                   default_max_running: int = 0) -> tuple[str, str] | None:
        """The next queued run that fits, now pending on its pool and leased to this coordinator:
        (run id, learner); None when no queued run fits a free pool. `max_running`: runs a tenant
        may hold pools with at once (0 = no limit), `default_max_running` for tenants not named."""
        args = json.dumps({"pools": list(pools), "max_running": dict(max_running or {}),
                           "default_max_running": default_max_running})
        taken = await self.r.eval(_TAKE, 2, QUEUE, LEARNERS, self.leases.owner, self.leases.ttl_ms,
                                  repr(time.time()), EVENTS_MAXLEN, args)
        return (str(taken[0]), str(taken[1])) if taken else None

    async def claim(self, run_id: str, learner: str) -> str:
        """Makes `run_id` the holder of `learner` unless another run validly holds it: '' when it
        holds it now, else that other run's id."""
        return str(await self.r.eval(_CLAIM, 2, learner_key(learner), LEARNERS, run_id, learner) or "")

    async def release(self, run_id: str, learner: str) -> None:
        """Deletes the run's claim on `learner` once it no longer holds it (it ended or paused)."""
        await self.r.eval(_RELEASE, 1, learner_key(learner), run_id)

    async def holder(self, learner: str) -> str:
        """The run whose claim names `learner` ('' when none; valid only while that run holds it)."""
        return str(await self.r.get(learner_key(learner)) or "")
