"""Background execution of runs: one asyncio task per active run, state transitions, failure
reasons, and resuming runs that a previous coordinator left running.

A learner holds one run at a time (ConfigureRun binds it), so at most one active run per learner
address: a run is launched only after it has claimed its learner, and the claim ends with its task."""

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
from services.coordinator.clients import CallPolicy, ServiceError
from services.coordinator.config import CoordinatorSettings, RunConfig
from services.coordinator.replicas import Services
from services.coordinator.runloop import ConfigRefused, RunContext, execute_run
from services.coordinator.store import TERMINAL, RunState, RunStore, new_run_id, state_change
from services.coordinator.trackers import RecordingStore

log = logging.getLogger("mmrl.coordinator.manager")


class TransitionError(Exception):
    """The requested action does not fit the run's state (HTTP 409)."""


@lru_cache(maxsize=8)
def load_tokenizer(model: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


async def _service_lost(exc: ServiceError, services: Services, run_id: str) -> bool:
    """True when the failed call means a service went away or restarted, not that the run is wrong:
    still UNAVAILABLE after the retries, or a learner that no longer holds the run."""
    if exc.code == "UNAVAILABLE":
        return True
    if exc.service != "learner" or exc.code != "FAILED_PRECONDITION":
        return False
    try:
        await services.learner.state(run_id)
    except ServiceError as probe:
        return probe.code in ("FAILED_PRECONDITION", "UNAVAILABLE")  # not configured for this run
    return False


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
            run = await self.store.get_run(run_id)
            config = RunConfig.model_validate(run["config"])
            endpoints = self.settings.endpoints_for(config)
            policy = CallPolicy(timeout_s=self.settings.rpc_timeout_s, retries=self.settings.rpc_retries)
            services = Services.connect(endpoints.env, endpoints.rollout, endpoints.learner, policy)
            # Before the tokenizer load, so a down service is named first. A new run fails at once; one
            # that has started before (resumed by a restarted coordinator) waits for its services.
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
            restarts = 0
            while True:
                try:
                    state = await execute_run(ctx)
                    break
                except ServiceError as exc:
                    if restarts >= self.settings.run_restarts or not await _service_lost(exc, services, run_id):
                        raise
                    restarts += 1
                    log.warning("a service was lost; the run resumes from its newest checkpoint",
                                extra={"run_id": run_id, "restart": restarts, "error": str(exc)})
                    await self.store.add_event(run_id, "restart", {"restart": restarts, "reason": str(exc)})
                    await services.wait_healthy(self.settings.service_wait_s)
            log.info("run ended", extra={"run_id": run_id, "state": state.value})
        except asyncio.CancelledError:
            log.info("run interrupted; it resumes when a coordinator starts again", extra={"run_id": run_id})
            raise
        except (ServiceError, ConfigRefused) as exc:
            await self._fail(run_id, str(exc))
        except Exception as exc:  # noqa: BLE001 - any crash of the loop fails the run with its reason
            log.exception("run failed", extra={"run_id": run_id})
            await self._fail(run_id, f"{type(exc).__name__}: {exc}")
        finally:
            tracing.end_step()
            if recording is not None:
                await recording.close_trackers()
            self.learners.pop(run_id, None)
            if services is not None:
                await services.close()

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
        run_id = new_run_id(config.name)
        with self._claimed(run_id, config):
            run = await self.store.create_run(run_id, config.name, config.model_dump(mode="json"), config.steps,
                                              trigger=trigger, claim=claim)
        self.launch(run_id)
        return run

    def _orphaned(self, run: dict[str, Any]) -> bool:
        """A run Redis holds as pending or running that no task here drives: its task ended while
        Redis did not answer, or a coordinator started with resume_runs off found it."""
        return run["state"] in LEFT_RUNNING and not self.is_active(run["id"]) and run["id"] not in self.learners

    # Each action decides on the run as Redis holds it at the moment of its write (change_run), so
    # a request cannot be lost to the run loop ending a step, or to another request, in between.
    async def pause(self, run_id: str) -> None:
        def request_pause(run: dict[str, Any]) -> dict[str, Any]:
            if self._orphaned(run):  # no run loop would act on a request: paused at once
                return {**state_change(RunState.PAUSED), "desired": ""}
            if run["state"] != RunState.RUNNING:
                raise TransitionError(f"cannot pause a run that is {run['state']}")
            if run["desired"] == "stop":
                raise TransitionError("the run is already stopping")
            return {"desired": "pause"}  # the run loop pauses at its next step boundary

        await self.store.change_run(run_id, request_pause)

    async def resume(self, run_id: str) -> None:
        def withdraw_pause(run: dict[str, Any]) -> dict[str, Any]:
            if run["state"] == RunState.RUNNING and run["desired"] == "pause" and not self._orphaned(run):
                return {"desired": ""}
            return {}

        if await self.store.change_run(run_id, withdraw_pause):
            return
        run = await self.store.get_run(run_id)
        orphaned = self._orphaned(run)
        if not orphaned and (run["state"] != RunState.PAUSED or self.is_active(run_id)):
            raise TransitionError(f"cannot resume a run that is {run['state']}")
        try:
            config = RunConfig.model_validate(run["config"])
        except ValidationError as exc:
            raise TransitionError(f"the run's stored config no longer validates: {exc}") from None

        def relaunch(run: dict[str, Any]) -> dict[str, Any]:
            if orphaned:  # driven again from its newest checkpoint, as a restarted coordinator would
                return {**_require_left_running(run), "desired": ""}
            if run["state"] != RunState.PAUSED:  # stopped meanwhile
                raise TransitionError(f"cannot resume a run that is {run['state']}")
            return {**state_change(RunState.PENDING), "desired": ""}

        with self._claimed(run_id, config):
            await self.store.change_run(run_id, relaunch)
        self.launch(run_id)

    async def stop(self, run_id: str) -> None:
        def request_stop(run: dict[str, Any]) -> dict[str, Any]:
            if run["state"] in TERMINAL:
                raise TransitionError(f"cannot stop a run that is {run['state']}")
            if run["state"] != RunState.PAUSED and (self.is_active(run_id) or run_id in self.learners):
                return {"desired": "stop"}  # running, or launched: the run loop stops at its next step boundary
            return state_change(RunState.STOPPED)  # no loop will act on it: paused, or pending and not launched

        await self.store.change_run(run_id, request_stop)

    async def resume_left_running(self) -> list[str]:
        """Relaunches runs a previous coordinator left pending or running, newest first; one whose
        learner another of them holds is paused instead (resume it when that run has ended)."""
        resumed = []
        for run in reversed(await self.store.list_runs()):
            if run["state"] not in LEFT_RUNNING or self.is_active(run["id"]):
                continue
            try:
                self.claim_learner(run["id"], RunConfig.model_validate(run["config"]))
            except (TransitionError, ValidationError) as exc:
                await self.store.change_run(run["id"], partial(_pause_if_left_running, reason=f"not resumed: {exc}"))
                log.warning("run left paused", extra={"run_id": run["id"], "reason": str(exc)})
                continue
            try:  # the listing may be stale: a stop may have come since
                await self.store.change_run(run["id"], _require_left_running)
            except TransitionError:
                self.learners.pop(run["id"], None)
                continue
            self.launch(run["id"])
            resumed.append(run["id"])
        if resumed:
            log.info("resuming runs", extra={"run_ids": resumed})
        return resumed

    async def shutdown(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
