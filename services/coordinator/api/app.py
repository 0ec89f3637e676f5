"""The coordinator's FastAPI app factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from services.coordinator.api import runs, system
from services.coordinator.api.deps import require_token
from services.coordinator.config import CoordinatorSettings
from services.coordinator.manager import RunManager
from services.coordinator.store import RunStore


def create_app(settings: CoordinatorSettings | None = None, store: RunStore | None = None) -> FastAPI:
    """Builds the app. Runs left running by a previous coordinator resume on startup."""
    settings = settings or CoordinatorSettings()
    store = store or RunStore.from_url(settings.redis_url)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        manager = RunManager(store, settings)
        app.state.settings = settings
        app.state.store = store
        app.state.manager = manager
        if settings.resume_runs and await store.ping():
            await manager.resume_left_running()
        yield
        await manager.shutdown()
        await store.close()

    app = FastAPI(title="MMRL coordinator", version="0.1.0", lifespan=lifespan,
                  description="Start, watch, pause, resume and stop multi-turn GRPO runs.")
    app.include_router(system.router)
    app.include_router(runs.router, dependencies=[Depends(require_token)])
    return app
