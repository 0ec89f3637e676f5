"""The coordinator's FastAPI app factory."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from services.common.waiting import poll_until
from services.coordinator.api import artifacts, configs, runs, system, triggers
from services.coordinator.api.console import mount_console
from services.coordinator.api.deps import require_token
from services.coordinator.config import CoordinatorSettings
from services.coordinator.manager import RunManager
from services.coordinator.store import RunStore
from services.coordinator.triggers.runtime import TriggerRuntime
from services.coordinator.triggers.settings import TriggerSettings

log = logging.getLogger("mmrl.coordinator")


def create_app(settings: CoordinatorSettings | None = None, store: RunStore | None = None,
               trigger_settings: TriggerSettings | None = None) -> FastAPI:
    """Builds the app. Runs left running by a previous coordinator resume on startup, as soon as
    Redis answers; the triggers (S3 events, the inbox) start runs from events."""
    settings = settings or CoordinatorSettings()
    store = store or RunStore.from_url(settings.redis_url)
    trigger_settings = trigger_settings or TriggerSettings()
    rules = trigger_settings.load_rules()  # a bad rules file stops the coordinator before it serves

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        manager = RunManager(store, settings)
        app.state.settings = settings
        app.state.store = store
        app.state.manager = manager
        resuming = asyncio.create_task(resume_when_redis_answers(manager)) if settings.resume_runs else None
        trigger_runtime = TriggerRuntime.start(manager, store, settings, trigger_settings, rules)
        app.state.triggers = trigger_runtime.triggers
        app.state.trigger_settings = trigger_settings
        yield
        await trigger_runtime.stop()
        if resuming is not None:
            resuming.cancel()
            await asyncio.gather(resuming, return_exceptions=True)
        await manager.shutdown()
        await store.close()

    async def resume_when_redis_answers(manager: RunManager, poll_s: float = 1.0) -> None:
        """Resumes the runs left running once Redis answers (it may start after the coordinator:
        Kubernetes has no start order); gives up after `service_wait_s`."""
        if not await poll_until(store.ping, settings.service_wait_s, poll_s):
            log.error("Redis did not answer: runs left running are not resumed",
                      extra={"redis_url": settings.redis_url, "waited_s": settings.service_wait_s})
            return
        await manager.resume_left_running()

    app = FastAPI(title="MMRL coordinator", version="0.1.0", lifespan=lifespan,
                  description="Start, watch, pause, resume and stop multi-turn GRPO runs.",
                  docs_url=None, redoc_url=None)
    app.include_router(system.router)
    for router in (runs.router, artifacts.router, configs.router):
        app.include_router(router, dependencies=[Depends(require_token)])
    app.include_router(triggers.router)  # its own auth: the token, or a signature for /s3
    mount_console(app)
    return app
