"""Background execution of runs: one asyncio task per active run, state transitions, failure
reasons, and resuming runs that a previous coordinator left running."""

from __future__ import annotations

import asyncio
import logging
from functools import lru_cache
from typing import Any

from services.common.conversation import ChatTokens
from services.coordinator.clients import CallPolicy, ServiceError, Services
from services.coordinator.config import CoordinatorSettings, RunConfig
from services.coordinator.runloop import ConfigRefused, RunContext, execute_run
from services.coordinator.store import TERMINAL, RunState, RunStore

log = logging.getLogger("mmrl.coordinator.manager")


class TransitionError(Exception):
    """The requested action does not fit the run's state (HTTP 409)."""


@lru_cache(maxsize=8)
def load_tokenizer(model: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


class RunManager:
    def __init__(self, store: RunStore, settings: CoordinatorSettings) -> None:
        self.store = store
        self.settings = settings
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def is_active(self, run_id: str) -> bool:
        task = self.tasks.get(run_id)
        return task is not None and not task.done()

    def launch(self, run_id: str) -> None:
        if self.is_active(run_id):
            return
        self.tasks[run_id] = asyncio.create_task(self._drive(run_id), name=f"run-{run_id}")

    async def _drive(self, run_id: str) -> None:
        run = await self.store.get_run(run_id)
        config = RunConfig.model_validate(run["config"])
        endpoints = self.settings.endpoints_for(config)
        policy = CallPolicy(timeout_s=self.settings.rpc_timeout_s, retries=self.settings.rpc_retries)
        services = Services.connect(endpoints.env, endpoints.rollout, endpoints.learner, policy)
        try:
            await services.require_healthy()  # before the tokenizer load, so a down service is named first
            tokenizer = await asyncio.to_thread(load_tokenizer, config.model)
            ctx = RunContext(run_id=run_id, config=config, services=services, store=self.store,
                             shared_root=self.settings.shared_root, tokenizer=tokenizer,
                             chat=ChatTokens.from_tokenizer(tokenizer))
            state = await execute_run(ctx)
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
            await services.close()

    async def _fail(self, run_id: str, reason: str) -> None:
        await self.store.set_state(run_id, RunState.FAILED, reason)
        log.error("run failed", extra={"run_id": run_id, "reason": reason})

    # actions from the API -----------------------------------------------------------------
    async def pause(self, run_id: str) -> None:
        run = await self.store.get_run(run_id)
        if run["state"] != RunState.RUNNING:
            raise TransitionError(f"cannot pause a run that is {run['state']}")
        await self.store.request(run_id, "pause")

    async def resume(self, run_id: str) -> None:
        run = await self.store.get_run(run_id)
        if run["state"] == RunState.RUNNING and run["desired"] == "pause":
            await self.store.request(run_id, "")
            return
        if run["state"] != RunState.PAUSED:
            raise TransitionError(f"cannot resume a run that is {run['state']}")
        await self.store.update_run(run_id, desired="")
        self.launch(run_id)

    async def stop(self, run_id: str) -> None:
        run = await self.store.get_run(run_id)
        if run["state"] in TERMINAL:
            raise TransitionError(f"cannot stop a run that is {run['state']}")
        if self.is_active(run_id):
            await self.store.request(run_id, "stop")
        else:
            await self.store.set_state(run_id, RunState.STOPPED)

    async def resume_left_running(self) -> list[str]:
        """Relaunches runs a previous coordinator left pending or running."""
        resumed = []
        for run in await self.store.list_runs():
            if run["state"] in (RunState.PENDING, RunState.RUNNING) and not self.is_active(run["id"]):
                self.launch(run["id"])
                resumed.append(run["id"])
        if resumed:
            log.info("resuming runs", extra={"run_ids": resumed})
        return resumed

    async def shutdown(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
