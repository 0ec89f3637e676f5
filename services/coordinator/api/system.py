"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response, status
from prometheus_client import CONTENT_TYPE_LATEST

from services.coordinator.api.deps import StoreDep
from services.coordinator.api.models import Health
from services.coordinator.ops import prometheus

router = APIRouter(tags=["system"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up and serving HTTP."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health)
async def readyz(store: StoreDep, response: Response) -> Health:
    """Ready when Redis answers."""
    redis_ok = await store.ping()
    if not redis_ok:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return Health(status="ok" if redis_ok else "unavailable", checks={"redis": redis_ok})


@router.get("/metrics")
async def metrics(store: StoreDep) -> Response:
    """Prometheus metrics: the runs in the store (at scrape time) and this process's (docs/observability.md)."""
    return Response(await prometheus.render(store), media_type=CONTENT_TYPE_LATEST)
