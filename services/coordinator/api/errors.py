"""Error replies of the API: a validation error names the fields without echoing the input (which
may be huge, or a NaN that JSON cannot encode), an action that does not fit a run's state is a 409
saying why, and Redis being unreachable is a 503 with Retry-After, not a 500."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.coordinator.ops.admission import NotAllowed
from services.coordinator.ops.manager import TransitionError
from services.coordinator.ops.store import LimitReached

RETRY_AFTER_S = 5


def _error(error: dict[str, Any]) -> dict[str, Any]:
    return {"loc": list(error.get("loc", ())), "msg": str(error.get("msg", "")), "type": str(error.get("type", ""))}


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": [_error(e) for e in exc.errors()]}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


async def not_allowed(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, NotAllowed)
    detail = [{"loc": ["body", "config", *exc.field.split(".")], "msg": str(exc), "type": "not_allowed"}]
    return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


async def conflict(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_409_CONFLICT)


async def limit_reached(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_429_TOO_MANY_REQUESTS)


async def redis_unavailable(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": f"the run store (Redis) is unreachable: {exc}; retry shortly"},
                        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
                        headers={"Retry-After": str(RETRY_AFTER_S)})


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(NotAllowed, not_allowed)
    app.add_exception_handler(TransitionError, conflict)
    app.add_exception_handler(LimitReached, limit_reached)
    for redis_error in (RedisConnectionError, RedisTimeoutError):
        app.add_exception_handler(redis_error, redis_unavailable)


# Documented on every /v1 route (OpenAPI), so clients can rely on them.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or invalid bearer token (when MMRL_API_TOKEN or MMRL_API_TOKENS_FILE is set)."},
    413: {"description": "Request body over MMRL_MAX_REQUEST_BYTES."},
    422: {"description": "Invalid input: the fields are named (non-finite numbers, unknown keys, disallowed "
                         "endpoints or model)."},
    503: {"description": "The run store (Redis) is unreachable; retry after the Retry-After seconds."},
}
RUN_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "No such run (or episode), or another tenant's."},
    409: {"description": "The action does not fit the run's state."},
}
LIMIT_RESPONSES: dict[int | str, dict[str, Any]] = {
    429: {"description": "The tenant's limit (max_queued, named in the detail) refuses another queued run."},
}
