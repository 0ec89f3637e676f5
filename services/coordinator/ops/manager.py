"""Background execution of runs: the queue's scheduling, one asyncio task per active run, state
transitions, failure reasons, and adopting runs that another coordinator left running.

A run is created queued. A learner pool holds one run at a time (ConfigureRun binds it), so the
scheduler (queue.py) starts a queued run only on a free pool, atomically in Redis: the run becomes
pending there and is launched here; its task's end frees the pool and schedules the next run. A run
is driven only under its lease (lease.py): `maintain` renews the leases of the runs driven here,
stops driving a run whose lease another coordinator took, adopts runs left running whose lease has
expired (a coordinator that died) and schedules queued runs that another coordinator's pools
freed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from functools import lru_cache, partial
from typing import Any

from pydantic import ValidationError
from redis.exceptions import RedisError

from services.common import tracing
from services.common.conversation import ChatTokens
from services.common.waiting import poll_until
from services.coordinator.config import CoordinatorSettings, RunConfig
from services.coordinator.grpo.runloop import ConfigRefused, RunContext, execute_run
from services.coordinator.ops.admission import check_run_config
from services.coordinator.ops.clients import CallPolicy, ServiceError
from services.coordinator.ops.lease import Leases, default_owner
from services.coordinator.ops.queue import Scheduler
from services.coordinator.ops.recovery import REDIS_OUTAGE, RedisUnavailable, drive
from services.coordinator.ops.replicas import Services
from services.coordinator.ops.retention import prune
from services.coordinator.ops.store import (
    DEFAULT_TENANT,
    HOLDING,
    TERMINAL,
    RunState,
    RunStore,
    new_run_id,
    state_change,
)
from services.coordinator.ops.tenants import Tenants
from services.coordinator.ops.trackers import RecordingStore

log = logging.getLogger("mmrl.coordinator.manager")


class TransitionError(Exception):
    """The requested action does not fit the run's state (HTTP 409)."""


_TOKENIZER_LOCK = threading.Lock()


@lru_cache(maxsize=8)
def load_tokenizer(model: str) -> Any:
    """The model's tokenizer. Runs that start together load theirs in threads at once, and
    transformers' lazy imports are not thread-safe (one thread saw `AutoTokenizer` missing), so one
    at a time."""
    with _TOKENIZER_LOCK:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model)


LEFT_RUNNING = HOLDING  # what a coordinator that went away leaves to the next


def _require_left_running(run: dict[str, Any]) -> dict[str, Any]:
    if run["state"] not in LEFT_RUNNING:
        raise TransitionError(f"the run is {run['state']} now")
    return {}


def _move_if_left_running(run: dict[str, Any], state: RunState, reason: str) -> dict[str, Any]:
    return state_change(state, reason) if run["state"] in LEFT_RUNNING else {}


class RunManager:
    def __init__(self, store: RunStore, settings: CoordinatorSettings, tenants: Tenants | None = None) -> None:
        self.store = store
        self.settings = settings
        self.tenants = tenants or Tenants([])
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.learners: dict[str, str] = {}  # run id -> learner pool, while a task here drives the run on it
        self.services: dict[str, Services] = {}  # run id -> its clients, while a task here drives it
        self.leases = Leases(store.r, settings.instance_id or default_owner(), settings.lease_ttl_s)
        self.scheduler = Scheduler(store.r, self.leases)
        self.closing = False

    def is_active(self, run_id: str) -> bool:
        task = self.tasks.get(run_id)
        return task is not None and not task.done()

    def launch(self, run_id: str, learner: str) -> None:
        """Starts the run's task on `learner`, the pool it holds."""
        self.learners[run_id] = learner
        if self.is_active(run_id):
            return
        self.tasks[run_id] = asyncio.create_task(self._drive(run_id), name=f"run-{run_id}")

    async def schedule(self) -> list[str]:
        """Starts queued runs, in queue order, on free learner pools until none fits; returns their ids."""
        started = []
        while not self.closing and (taken := await self.scheduler.take(self.settings.pools,
                                                                       self.tenants.max_running())) is not None:
            run_id, learner = taken
            self.launch(run_id, learner)
            started.append(run_id)
        if started:
            log.info("queued runs started", extra={"run_ids": started})
        return started

    async def schedule_soon(self) -> None:
        """schedule(), where a Redis failure is only logged: the next `maintain` round schedules again."""
        try:
            await self.schedule()
        except RedisError as exc:
            log.warning("scheduling the queue failed; it is tried again shortly", extra={"error": str(exc)})

    async def _drive(self, run_id: str) -> None:
        services: Services | None = None
        recording: RecordingStore | None = None
        ended = False  # the task ran its course (not cancelled): the run's pool can take the next run
        try:
            if not await self.leases.acquire(run_id):
                log.info("another coordinator drives the run", extra={"run_id": run_id})
                return
            run = await self.store.get_run(run_id)
            config = RunConfig.model_validate(run["config"])
            endpoints = self.settings.endpoints_for(config, self.learners[run_id])
            policy = CallPolicy(timeout_s=self.settings.rpc_timeout_s, retries=self.settings.rpc_retries)
            services = Services.connect(endpoints.env, endpoints.rollout, endpoints.learner, policy)
            self.services[run_id] = services
            # Before the tokenizer load, so a down service is named first. A new run fails at once; one
            # that has started before (resumed or adopted) waits for its services.
            if run["checkpoint_step"] < 0:
                await services.require_healthy()
            else:
                await services.wait_healthy(self.settings.service_wait_s)
            tokenizer = await asyncio.to_thread(load_tokenizer, config.model)
            recording = await RecordingStore.open(self.store, run_id, config.loggers, run["config"],
                                                  self.settings.shared_root)
            ctx = RunContext(run_id=run_id, config=config, services=services, store=recording,
                             shared_root=self.settings.shared_root, tokenizer=tokenizer,
                             chat=ChatTokens.from_tokenizer(tokenizer), pools=len(self.settings.pools))
            state = await drive(run_id, lambda: execute_run(ctx), services, self.store, self.settings)
            log.info("run ended", extra={"run_id": run_id, "state": state.value})
            ended = True
        except asyncio.CancelledError:
            log.info("run interrupted; it resumes when a coordinator takes it again", extra={"run_id": run_id})
            raise
        except (ServiceError, ConfigRefused, RedisUnavailable, *REDIS_OUTAGE) as exc:
            await self._fail(run_id, str(exc))
            ended = True
        except Exception as exc:  # noqa: BLE001 - any crash of the loop fails the run with its reason
            log.exception("run failed", extra={"run_id": run_id})
            await self._fail(run_id, f"{type(exc).__name__}: {exc}")
            ended = True
        finally:
            tracing.end_step()
            if recording is not None:
                await recording.close_trackers()
            learner = self.learners.pop(run_id, "")
            self.services.pop(run_id, None)
            if services is not None:
                if ended:  # its adapters' room goes to the runs of the other pools
                    with contextlib.suppress(ServiceError, TimeoutError, asyncio.CancelledError):
                        await asyncio.wait_for(services.rollouts.release_adapters(run_id), timeout=30)
                await services.close()
            with contextlib.suppress(RedisError, asyncio.CancelledError):
                await self.leases.release(run_id)
                if learner:
                    await self.scheduler.release(run_id, learner)
        if ended:
            await self.schedule_soon()  # the pool is free: the next queued run

    async def _fail(self, run_id: str, reason: str) -> None:
        """Records the failure, retrying while Redis does not answer (for up to service_wait_s): a run
        whose failure went unrecorded would stay 'running' with nothing driving it."""
        log.error("run failed", extra={"run_id": run_id, "reason": reason})
        errors: list[RedisError] = []

        async def recorded() -> bool:
            try:
                await self.store.set_state(run_id, RunState.FAILED, reason)
            except RedisError as exc:
                errors.append(exc)
                return False
            return True

        if not await poll_until(recorded, self.settings.service_wait_s, poll_s=2.0):
            log.error("the failure could not be recorded; pause, resume or stop the run when Redis answers",
                      extra={"run_id": run_id, "error": str(errors[-1])})

    # actions from the API -----------------------------------------------------------------
    async def create(self, config: RunConfig, trigger: dict[str, Any] | None = None, claim: str = "",
                     tenant: str = DEFAULT_TENANT, priority: int | None = None) -> dict[str, Any]:
        """Records a new run in the queue and starts it at once when a learner pool is free for it. A
        run an event starts carries the event (`trigger`) and its dedupe key (`claim`: AlreadyClaimed
        when taken). `priority` overrides the config's. The tenant's max_queued: LimitReached."""
        check_run_config(config, self.settings)  # NotAllowed (422) before anything is recorded
        run_id = new_run_id(config.name)
        await self.store.create_run(run_id, config.name, config.model_dump(mode="json"), config.steps,
                                    trigger=trigger, claim=claim, tenant=tenant,
                                    priority=config.priority if priority is None else priority,
                                    max_queued=self.tenants.limits(tenant).max_queued)
        await self.schedule_soon()
        return await self.store.get_run(run_id)

    def _orphaned(self, run: dict[str, Any], leased: bool) -> bool:
        """A run Redis holds as pending or running that no coordinator drives (`leased`: another
        coordinator holds its lease): its task ended while Redis did not answer, or a coordinator
        started with resume_runs off found it."""
        return (run["state"] in LEFT_RUNNING and not leased and not self.is_active(run["id"])
                and run["id"] not in self.learners)

    async def _leased_elsewhere(self, run_id: str) -> bool:
        holder = await self.leases.holder(run_id)
        return bool(holder) and holder != self.leases.owner

    # Each action decides on the run as Redis holds it at the moment of its write (change_run), so
    # a request cannot be lost to the run loop ending a step, the scheduler or another request.
    async def pause(self, run_id: str) -> None:
        leased = await self._leased_elsewhere(run_id)

        def request_pause(run: dict[str, Any]) -> dict[str, Any]:
            if self._orphaned(run, leased):  # no run loop would act on a request: paused at once
                return {**state_change(RunState.PAUSED), "desired": ""}
            if run["state"] != RunState.RUNNING:
                raise TransitionError(f"cannot pause a run that is {run['state']}")
            if run["desired"] == "stop":
                raise TransitionError("the run is already stopping")
            return {"desired": "pause"}  # the run loop pauses at its next step boundary

        if await self.store.change_run(run_id, request_pause):
            await self.schedule_soon()  # an orphan paused at once freed its pool

    async def resume(self, run_id: str) -> None:
        """Puts a paused or failed run (or one left running that nothing drives) back in the queue; it
        continues from its newest complete checkpoint when a pool is free. A failed run's reason stays
        in its event history. The tenant's max_queued: LimitReached."""
        leased = await self._leased_elsewhere(run_id)

        def withdraw_pause(run: dict[str, Any]) -> dict[str, Any]:
            if run["state"] == RunState.RUNNING and run["desired"] == "pause" and not self._orphaned(run, leased):
                return {"desired": ""}
            return {}

        if await self.store.change_run(run_id, withdraw_pause):
            return
        run = await self.store.get_run(run_id)
        orphaned = self._orphaned(run, leased)
        resumable = (RunState.PAUSED, RunState.FAILED)
        if not orphaned and (run["state"] not in resumable or self.is_active(run_id) or leased):
            raise TransitionError(f"cannot resume a run that is {run['state']}")
        try:
            RunConfig.model_validate(run["config"])
        except ValidationError as exc:
            raise TransitionError(f"the run's stored config no longer validates: {exc}") from None

        def requeue(run: dict[str, Any]) -> dict[str, Any]:
            if orphaned:  # driven again from its newest checkpoint, as a restarted coordinator would
                return {**_require_left_running(run), **state_change(RunState.QUEUED), "desired": ""}
            if run["state"] not in resumable:  # stopped meanwhile
                raise TransitionError(f"cannot resume a run that is {run['state']}")
            return {**state_change(RunState.QUEUED), "desired": ""}

        await self.store.change_run(run_id, requeue, max_queued=self.tenants.limits(run["tenant"]).max_queued)
        if run["state"] == RunState.FAILED:
            await self.store.add_event(run_id, "resume", {"from": "failed", "failure_reason": run["failure_reason"],
                                                          "checkpoint_step": run["checkpoint_step"]})
        await self.schedule_soon()

    async def stop(self, run_id: str) -> None:
        """Stops a run: a queued one leaves the queue at once, a driven one at its next step boundary."""
        leased = await self._leased_elsewhere(run_id)

        def request_stop(run: dict[str, Any]) -> dict[str, Any]:
            if run["state"] in TERMINAL:
                raise TransitionError(f"cannot stop a run that is {run['state']}")
            if run["state"] in LEFT_RUNNING and (self.is_active(run_id) or run_id in self.learners or leased):
                return {"desired": "stop"}  # running, or launched: the run loop stops at its next step boundary
            return state_change(RunState.STOPPED)  # no loop will act on it: queued, paused, or left behind

        if "state" in await self.store.change_run(run_id, request_stop):
            await self.schedule_soon()

    async def set_priority(self, run_id: str, priority: int) -> None:
        """A run's new priority: a queued run moves to its place among the runs of that priority (the
        order in which they joined the queue); another keeps it for when it is queued again."""

        def reprioritise(run: dict[str, Any]) -> dict[str, Any]:
            if run["state"] in TERMINAL:
                raise TransitionError(f"cannot change the priority of a run that is {run['state']}")
            return {"priority": priority}

        await self.store.change_run(run_id, reprioritise)

    async def resume_left_running(self) -> list[str]:
        """Relaunches runs left pending or running whose lease is free (their coordinator died or
        stopped), newest first, on the pool each holds; one whose pool another run holds, or whose pool
        is no longer configured, goes back to the queue."""
        resumed = []
        for run in reversed(await self.store.list_runs()):
            if run["state"] not in LEFT_RUNNING or self.is_active(run["id"]) or run["id"] in self.learners:
                continue
            if not await self.leases.acquire(run["id"]):
                continue  # another coordinator drives it
            try:
                pin = RunConfig.model_validate(run["config"]).endpoints.learner
            except ValidationError as exc:
                await self._leave(run["id"], RunState.PAUSED, f"not resumed: {exc}")
                continue
            allowed = [pin] if pin else self.settings.pools
            learner = run["learner"] or allowed[0]  # a run recorded before pools were: the first
            holder = await self.scheduler.claim(run["id"], learner) if learner in allowed else ""
            if learner not in allowed or holder:
                why = (f"the learner at {learner} is busy with run {holder!r}" if holder
                       else f"its learner {learner} is not among MMRL_LEARNER_ADDRS")
                await self._leave(run["id"], RunState.QUEUED, f"re-queued: {why}")
                continue
            try:  # the listing may be stale: a stop may have come since
                await self.store.change_run(run["id"], _require_left_running)
            except TransitionError:
                await self.leases.release(run["id"])
                await self.scheduler.release(run["id"], learner)
                continue
            self.launch(run["id"], learner)
            resumed.append(run["id"])
        if resumed:
            log.info("resuming runs", extra={"run_ids": resumed})
        return resumed

    async def _leave(self, run_id: str, state: RunState, reason: str) -> None:
        """A run left running that is not relaunched here: `state` (paused or queued), with the reason."""
        await self.store.change_run(run_id, partial(_move_if_left_running, state=state, reason=reason))
        await self.leases.release(run_id)
        log.warning("run left running not relaunched", extra={"run_id": run_id, "state": state.value,
                                                              "reason": reason})

    async def renew_leases(self) -> None:
        """Renews the lease of every run driven here; a run whose lease another coordinator holds
        (this one was cut off from Redis past the lease) is no longer driven here."""
        for run_id, task in list(self.tasks.items()):
            if task.done():
                continue
            if not await self.leases.renew(run_id):
                log.warning("lease taken by another coordinator: no longer driving the run",
                            extra={"run_id": run_id, "holder": await self.leases.holder(run_id)})
                task.cancel()

    async def prune_storage(self) -> None:
        """Applies the retention (retention.py) to every run driven here; a replica that does not
        answer ListAdapters defers it (a version it serves must not go)."""
        if not (self.settings.keep_adapters or self.settings.keep_checkpoints):
            return
        for run_id, services in list(self.services.items()):
            try:
                served = await services.rollouts.served_versions(run_id)
            except ServiceError:
                continue
            current = (await self.store.get_run(run_id))["adapter_version"]
            await asyncio.to_thread(prune, self.settings.shared_root, run_id, keep_adapters=self.settings.keep_adapters,
                                    keep_checkpoints=self.settings.keep_checkpoints, served_versions=served,
                                    current_version=current)

    async def maintain(self) -> None:
        """Forever: renew leases every third of their time to live, with resume_runs adopt runs left
        running whose lease is free, start queued runs on free pools, and prune old adapters and
        checkpoints. Redis outages are waited out."""
        while True:
            try:
                await self.renew_leases()
                if self.settings.resume_runs:
                    await self.resume_left_running()
                await self.schedule()
                await self.prune_storage()
            except RedisError as exc:
                log.warning("Redis did not answer; leases and adoption wait for it", extra={"error": str(exc)})
            except OSError as exc:
                log.warning("pruning shared storage failed", extra={"error": str(exc)})
            await asyncio.sleep(self.settings.lease_ttl_s / 3)

    async def shutdown(self) -> None:
        self.closing = True  # the runs interrupted here keep their pools; nothing new starts
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
