"""The coordinator's FastAPI app factory."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from services.coordinator.api import artifacts, configs, errors, guard, runs, system, triggers
from services.coordinator.api.console import mount_console
from services.coordinator.api.deps import current_caller
from services.coordinator.config import CoordinatorSettings
from services.coordinator.ops.manager import RunManager
from services.coordinator.ops.store import RunStore
from services.coordinator.ops.tenants import Tenants
from services.coordinator.triggers.runtime import TriggerRuntime
from services.coordinator.triggers.settings import TriggerSettings

log = logging.getLogger("mmrl.coordinator")


def create_app(settings: CoordinatorSettings | None = None, store: RunStore | None = None,
               trigger_settings: TriggerSettings | None = None) -> FastAPI:
    """Builds the app. Runs left running by a coordinator that died resume here once their lease
    expires and Redis answers (RunManager.maintain); the triggers (S3 events, the inbox) start runs
    from events."""
    settings = settings or CoordinatorSettings()
    store = store or RunStore.from_url(settings.redis_url)
    trigger_settings = trigger_settings or TriggerSettings()
    rules = trigger_settings.load_rules()  # a bad rules or tokens file stops the coordinator before it serves
    tenants = Tenants.load(settings.api_token, settings.api_tokens_file)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        manager = RunManager(store, settings, tenants)
        app.state.settings = settings
        app.state.tenants = tenants
        app.state.store = store
        app.state.manager = manager
        maintaining = asyncio.create_task(manager.maintain(), name="leases")
        trigger_runtime = TriggerRuntime.start(manager, store, settings, trigger_settings, rules)
        app.state.triggers = trigger_runtime.triggers
        app.state.trigger_settings = trigger_settings
        yield
        await trigger_runtime.stop()
        maintaining.cancel()
        await asyncio.gather(maintaining, return_exceptions=True)
        await manager.shutdown()
        await store.close()

    app = FastAPI(title="MMRL coordinator", version="0.1.0", lifespan=lifespan,
                  description="Start, watch, pause, resume and stop multi-turn GRPO runs.",
                  docs_url=None, redoc_url=None)
    app.include_router(system.router)
    for router in (runs.router, artifacts.router, configs.router):
        app.include_router(router, dependencies=[Depends(current_caller)], responses=errors.ERROR_RESPONSES)
    app.include_router(triggers.router, responses=errors.ERROR_RESPONSES)  # own auth: token, or signature for /s3
    errors.install(app)
    guard.install(app, tenants.tokens(), settings.max_request_bytes)  # auth and size before any body is read
    mount_console(app)
    return app
