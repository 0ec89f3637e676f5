"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response, status
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from services.coordinator.api.deps import StoreDep
from services.coordinator.api.models import Health
from services.coordinator.store import RunState

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
    """Prometheus metrics computed from the run store at scrape time."""
    registry = CollectorRegistry()
    runs_by_state = Gauge("mmrl_runs", "Runs by state", ["state"], registry=registry)
    step = Gauge("mmrl_run_step", "Steps completed", ["run_id"], registry=registry)
    solve = Gauge("mmrl_run_eval_greedy_solve_rate", "Latest greedy eval solve rate", ["run_id"],
                  registry=registry)
    reward = Gauge("mmrl_run_reward_mean", "Mean reward of the latest step", ["run_id"], registry=registry)
    counts = dict.fromkeys((s.value for s in RunState), 0)
    if await store.ping():
        for run in await store.list_runs():
            counts[run["state"]] += 1
            step.labels(run["id"]).set(run["step"])
            if run["state"] in (RunState.RUNNING, RunState.PAUSED):
                evals = await store.evals(run["id"])
                if evals:
                    solve.labels(run["id"]).set(evals[-1]["greedy_solve_rate"])
                steps = await store.metrics(run["id"])
                if steps:
                    reward.labels(run["id"]).set(steps[-1]["reward/mean"])
    for state, count in counts.items():
        runs_by_state.labels(state).set(count)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
