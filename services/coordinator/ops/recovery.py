"""Driving a run through faults: a lost service or a Redis outage makes the run wait for it (polling
with backoff, up to the outage window `service_wait_s`) and redo its work from the newest complete
checkpoint (`execute_run` rolls the learner back and replays; every step is recorded once).

A failure counts as a lost service when the service went away or came back without the state the
call referred to (ServiceError.lost: UNAVAILABLE, DEADLINE_EXCEEDED, an env or rollout NOT_FOUND),
or when the learner no longer holds the run (it restarted). Redos without a completed step between
them are bounded by `run_restarts`, so a deterministic error still fails the run.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.common.waiting import poll_until
from services.coordinator.config import CoordinatorSettings
from services.coordinator.ops.clients import ServiceError
from services.coordinator.ops.replicas import Services
from services.coordinator.ops.store import RunState, RunStore

log = logging.getLogger("mmrl.coordinator.recovery")
REDIS_OUTAGE = (RedisConnectionError, RedisTimeoutError)


class RedisUnavailable(Exception):
    """Redis did not answer within the outage window."""


async def service_lost(exc: ServiceError, services: Services, run_id: str) -> bool:
    """True when the failed call means a service went away or restarted, not that the run is wrong."""
    if exc.lost:
        return True
    if exc.service != "learner" or exc.code != "FAILED_PRECONDITION":
        return False
    try:
        await services.learner.state(run_id)
    except ServiceError as probe:
        return probe.code in ("FAILED_PRECONDITION", "UNAVAILABLE")  # not configured for this run
    return False


async def wait_for_redis(store: RunStore, timeout_s: float) -> None:
    if not await poll_until(store.ping, timeout_s, poll_s=0.5, max_poll_s=15.0):
        raise RedisUnavailable(f"Redis did not answer within the outage window ({timeout_s:.0f} s)")


async def drive(run_id: str, execute: Callable[[], Awaitable[RunState]], services: Services, store: RunStore,
                settings: CoordinatorSettings) -> RunState:
    """Runs `execute()` (the run loop from its newest checkpoint) until it returns; a lost service or
    Redis outage is waited out and the loop started again. Raises what cannot be recovered."""
    restarts, progress = 0, -1
    while True:
        try:
            return await execute()
        except ServiceError as exc:
            if not await service_lost(exc, services, run_id):
                raise
            failure: Exception = exc
        except REDIS_OUTAGE as exc:
            failure = exc
        log.warning("a service or Redis was lost; waiting for it, then redoing from the newest checkpoint",
                    extra={"run_id": run_id, "error": str(failure)})
        await wait_for_redis(store, settings.service_wait_s)
        step = (await store.get_run(run_id))["step"]
        restarts, progress = (1, step) if step > progress else (restarts + 1, progress)
        if restarts > settings.run_restarts:
            raise failure
        await store.add_event(run_id, "restart", {"restart": restarts, "step": step, "reason": str(failure)})
        await services.wait_healthy(settings.service_wait_s)
