"""Background execution of runs: one asyncio task per active run, state transitions, failure
reasons, and adopting runs that another coordinator left running.

A learner holds one run at a time (ConfigureRun binds it), so at most one active run per learner
address: a run is launched only after it has claimed its learner, and the claim ends with its task.
A run is driven only under its lease (lease.py): `maintain` renews the leases of the runs driven
here, stops driving a run whose lease another coordinator took, and adopts runs left running whose
lease has expired (a coordinator that died)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
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
from services.coordinator.ops.recovery import REDIS_OUTAGE, RedisUnavailable, drive
from services.coordinator.ops.replicas import Services
from services.coordinator.ops.retention import prune
from services.coordinator.ops.store import TERMINAL, RunState, RunStore, new_run_id, state_change
from services.coordinator.ops.trackers import RecordingStore

log = logging.getLogger("mmrl.coordinator.manager")


class TransitionError(Exception):
    """The requested action does not fit the run's state (HTTP 409)."""


@lru_cache(maxsize=8)
def load_tokenizer(model: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


LEFT_RUNNING = (RunState.PENDING, RunState.RUNNING)  # what a coordinator that went away leaves to the next


def _require_left_running(run: dict[str, Any]) -> dict[str, Any]:
    if run["state"] not in LEFT_RUNNING:
        raise TransitionError(f"the run is {run['state']} now")
    return {}


def _pause_if_left_running(run: dict[str, Any], reason: str) -> dict[str, Any]:
    return state_change(RunState.PAUSED, reason) if run["state"] in LEFT_RUNNING else {}


class RunManager:
    def __init__(self, store: RunStore, settings: CoordinatorSettings) -> None:
        self.store = store
        self.settings = settings
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.learners: dict[str, str] = {}  # run id -> learner address, while the run holds it
        self.services: dict[str, Services] = {}  # run id -> its clients, while a task here drives it
        self.leases = Leases(store.r, settings.instance_id or default_owner(), settings.lease_ttl_s)

    def is_active(self, run_id: str) -> bool:
        task = self.tasks.get(run_id)
        return task is not None and not task.done()

    def claim_learner(self, run_id: str, config: RunConfig) -> None:
        """Reserves the run's learner (no await: two requests cannot both pass); TransitionError
        when another run holds it."""
        learner = self.settings.endpoints_for(config).learner
        for other, address in self.learners.items():
            if other != run_id and address == learner:
                raise TransitionError(
                    f"the learner at {learner} is busy with run {other!r}; pause or stop that run first"
                )
        self.learners[run_id] = learner

    @contextlib.contextmanager
    def _claimed(self, run_id: str, config: RunConfig) -> Iterator[None]:
        """Claims the run's learner for the block that records the run before its launch; a failure
        there releases the claim."""
        self.claim_learner(run_id, config)
        try:
            yield
        except BaseException:
            self.learners.pop(run_id, None)
            raise

    def launch(self, run_id: str) -> None:
        """Starts the run's task; the run must have claimed its learner."""
        assert run_id in self.learners, "claim_learner first"
        if self.is_active(run_id):
            return
        self.tasks[run_id] = asyncio.create_task(self._drive(run_id), name=f"run-{run_id}")

    async def _drive(self, run_id: str) -> None:
        services: Services | None = None
        recording: RecordingStore | None = None
        try:
            if not await self.leases.acquire(run_id):
                log.info("another coordinator drives the run", extra={"run_id": run_id})
                return
            run = await self.store.get_run(run_id)
            config = RunConfig.model_validate(run["config"])
            endpoints = self.settings.endpoints_for(config)
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
                             chat=ChatTokens.from_tokenizer(tokenizer))
            state = await drive(run_id, lambda: execute_run(ctx), services, self.store, self.settings)
            log.info("run ended", extra={"run_id": run_id, "state": state.value})
        except asyncio.CancelledError:
            log.info("run interrupted; it resumes when a coordinator takes it again", extra={"run_id": run_id})
            raise
        except (ServiceError, ConfigRefused, RedisUnavailable, *REDIS_OUTAGE) as exc:
            await self._fail(run_id, str(exc))
        except Exception as exc:  # noqa: BLE001 - any crash of the loop fails the run with its reason
            log.exception("run failed", extra={"run_id": run_id})
            await self._fail(run_id, f"{type(exc).__name__}: {exc}")
        finally:
            tracing.end_step()
            if recording is not None:
                await recording.close_trackers()
            self.learners.pop(run_id, None)
            self.services.pop(run_id, None)
            if services is not None:
                await services.close()
            with contextlib.suppress(RedisError, asyncio.CancelledError):
                await self.leases.release(run_id)

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
    async def create(self, config: RunConfig, trigger: dict[str, Any] | None = None,
                     claim: str = "") -> dict[str, Any]:
        """Records a new run and launches it; TransitionError when its learner is busy. A run an event
        starts carries the event (`trigger`) and its dedupe key (`claim`: AlreadyClaimed when taken)."""
        check_run_config(config, self.settings)  # NotAllowed (422) before anything is recorded
        run_id = new_run_id(config.name)
        with self._claimed(run_id, config):
            run = await self.store.create_run(run_id, config.name, config.model_dump(mode="json"), config.steps,
                                              trigger=trigger, claim=claim)
        self.launch(run_id)
        return run

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
    # a request cannot be lost to the run loop ending a step, or to another request, in between.
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

        await self.store.change_run(run_id, request_pause)

    async def resume(self, run_id: str) -> None:
        """Resumes a paused or failed run (or one left running that nothing drives) from its newest
        complete checkpoint; a failed run's reason stays in its event history."""
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
            config = RunConfig.model_validate(run["config"])
        except ValidationError as exc:
            raise TransitionError(f"the run's stored config no longer validates: {exc}") from None

        def relaunch(run: dict[str, Any]) -> dict[str, Any]:
            if orphaned:  # driven again from its newest checkpoint, as a restarted coordinator would
                return {**_require_left_running(run), "desired": ""}
            if run["state"] not in resumable:  # stopped meanwhile
                raise TransitionError(f"cannot resume a run that is {run['state']}")
            return {**state_change(RunState.PENDING), "desired": ""}

        with self._claimed(run_id, config):
            await self.store.change_run(run_id, relaunch)
        if run["state"] == RunState.FAILED:
            await self.store.add_event(run_id, "resume", {"from": "failed", "failure_reason": run["failure_reason"],
                                                          "checkpoint_step": run["checkpoint_step"]})
        self.launch(run_id)

    async def stop(self, run_id: str) -> None:
        leased = await self._leased_elsewhere(run_id)

        def request_stop(run: dict[str, Any]) -> dict[str, Any]:
            if run["state"] in TERMINAL:
                raise TransitionError(f"cannot stop a run that is {run['state']}")
            if run["state"] != RunState.PAUSED and (self.is_active(run_id) or run_id in self.learners or leased):
                return {"desired": "stop"}  # running, or launched: the run loop stops at its next step boundary
            return state_change(RunState.STOPPED)  # no loop will act on it: paused, or pending and not launched

        await self.store.change_run(run_id, request_stop)

    async def resume_left_running(self) -> list[str]:
        """Relaunches runs left pending or running whose lease is free (their coordinator died or
        stopped), newest first; one whose learner another of them holds is paused instead (resume
        it when that run has ended)."""
        resumed = []
        for run in reversed(await self.store.list_runs()):
            if run["state"] not in LEFT_RUNNING or self.is_active(run["id"]) or run["id"] in self.learners:
                continue
            if not await self.leases.acquire(run["id"]):
                continue  # another coordinator drives it
            try:
                self.claim_learner(run["id"], RunConfig.model_validate(run["config"]))
            except (TransitionError, ValidationError) as exc:
                await self.store.change_run(run["id"], partial(_pause_if_left_running, reason=f"not resumed: {exc}"))
                await self.leases.release(run["id"])
                log.warning("run left paused", extra={"run_id": run["id"], "reason": str(exc)})
                continue
            try:  # the listing may be stale: a stop may have come since
                await self.store.change_run(run["id"], _require_left_running)
            except TransitionError:
                self.learners.pop(run["id"], None)
                await self.leases.release(run["id"])
                continue
            self.launch(run["id"])
            resumed.append(run["id"])
        if resumed:
            log.info("resuming runs", extra={"run_ids": resumed})
        return resumed

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
        running whose lease is free, and prune old adapters and checkpoints. Redis outages are
        waited out."""
        while True:
            try:
                await self.renew_leases()
                if self.settings.resume_runs:
                    await self.resume_left_running()
                await self.prune_storage()
            except RedisError as exc:
                log.warning("Redis did not answer; leases and adoption wait for it", extra={"error": str(exc)})
            except OSError as exc:
                log.warning("pruning shared storage failed", extra={"error": str(exc)})
            await asyncio.sleep(self.settings.lease_ttl_s / 3)

    async def shutdown(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
