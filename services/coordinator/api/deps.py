"""FastAPI dependencies: the run store, the run manager, the caller a bearer token speaks for, and
runs as that caller may see them (another tenant's run is a 404, as an unknown one)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.coordinator.config import CoordinatorSettings
from services.coordinator.ops.manager import RunManager
from services.coordinator.ops.store import RunNotFound, RunStore
from services.coordinator.ops.tenants import Caller, Tenants

_bearer = HTTPBearer(auto_error=False)


def get_settings(request: Request) -> CoordinatorSettings:
    return request.app.state.settings  # type: ignore[no-any-return]


def get_store(request: Request) -> RunStore:
    return request.app.state.store  # type: ignore[no-any-return]


def get_manager(request: Request) -> RunManager:
    return request.app.state.manager  # type: ignore[no-any-return]


def get_tenants(request: Request) -> Tenants:
    return request.app.state.tenants  # type: ignore[no-any-return]


SettingsDep = Annotated[CoordinatorSettings, Depends(get_settings)]
StoreDep = Annotated[RunStore, Depends(get_store)]
ManagerDep = Annotated[RunManager, Depends(get_manager)]
TenantsDep = Annotated[Tenants, Depends(get_tenants)]


def bearer_token(credentials: HTTPAuthorizationCredentials | None) -> str:
    return credentials.credentials if credentials and credentials.scheme.lower() == "bearer" else ""


def current_caller(
    tenants: TenantsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    """Whom the request's `Authorization: Bearer <token>` speaks for (401 for a token not listed;
    without any token configured, every caller is an admin of the tenant 'default')."""
    caller = tenants.caller(bearer_token(credentials))
    if caller is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or invalid bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
    return caller


CallerDep = Annotated[Caller, Depends(current_caller)]


async def existing_run(run_id: str, store: StoreDep, caller: CallerDep) -> dict[str, Any]:
    """The run, if the caller may see it: another tenant's run is a 404 worded as an unknown one's."""
    try:
        run = await store.get_run(run_id)
    except RunNotFound:
        run = None
    if run is None or not caller.sees(run):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"run {run_id!r} not found")
    return run


RunDep = Annotated[dict[str, Any], Depends(existing_run)]
