"""FastAPI dependencies: the run store, the run manager and bearer-token auth."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.coordinator.config import CoordinatorSettings
from services.coordinator.ops.manager import RunManager
from services.coordinator.ops.store import RunNotFound, RunStore

_bearer = HTTPBearer(auto_error=False)


def get_settings(request: Request) -> CoordinatorSettings:
    return request.app.state.settings  # type: ignore[no-any-return]


def get_store(request: Request) -> RunStore:
    return request.app.state.store  # type: ignore[no-any-return]


def get_manager(request: Request) -> RunManager:
    return request.app.state.manager  # type: ignore[no-any-return]


SettingsDep = Annotated[CoordinatorSettings, Depends(get_settings)]
StoreDep = Annotated[RunStore, Depends(get_store)]
ManagerDep = Annotated[RunManager, Depends(get_manager)]


def require_token(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """When MMRL_API_TOKEN is set, every /v1 route needs `Authorization: Bearer <token>`."""
    expected = settings.api_token
    if not expected:
        return
    given = credentials.credentials if credentials and credentials.scheme.lower() == "bearer" else ""
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or invalid bearer token",
                            headers={"WWW-Authenticate": "Bearer"})


async def existing_run(run_id: str, store: StoreDep) -> dict:  # type: ignore[type-arg]
    try:
        return await store.get_run(run_id)
    except RunNotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"run {run_id!r} not found") from None


RunDep = Annotated[dict, Depends(existing_run)]  # type: ignore[type-arg]
