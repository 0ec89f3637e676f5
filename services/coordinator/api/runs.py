"""/v1/runs: create, list, inspect and control runs; metrics, evals, episodes and events."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, status
from fastapi.responses import StreamingResponse

from services.common.messages import shown
from services.coordinator.api.deps import CallerDep, ManagerDep, RunDep, StoreDep
from services.coordinator.api.errors import LIMIT_RESPONSES, RUN_RESPONSES
from services.coordinator.api.models import (
    EpisodeList,
    EvalList,
    MetricsList,
    Run,
    RunCreate,
    RunList,
    RunSummary,
    RunUpdate,
)
from services.coordinator.ops.store import TERMINAL, RunState

router = APIRouter(prefix="/v1/runs", tags=["runs"])
_EVENT_ID = re.compile(r"\d{1,20}(-\d{1,20})?")  # a Redis stream id (SSE Last-Event-ID)


async def _with_latest(store: StoreDep, run: dict) -> Run:  # type: ignore[type-arg]
    metrics = await store.metrics(run["id"])
    evals = await store.evals(run["id"])
    return Run(**run, latest_metrics=metrics[-1] if metrics else None, latest_eval=evals[-1] if evals else None)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=Run, responses=LIMIT_RESPONSES)
async def create_run(body: RunCreate, store: StoreDep, manager: ManagerDep, caller: CallerDep) -> Run:
    """Records a run of the caller's tenant in the queue; it starts at once when a learner pool is
    free (state pending), else it waits (state queued, with its queue position). Its endpoints must be
    addresses the coordinator is configured with, its model under the shared root or allowed (422
    otherwise); the tenant's max_queued refuses it with 429."""
    run = await manager.create(body.config, tenant=caller.tenant, priority=body.priority)
    return await _with_latest(store, run)


@router.get("", response_model=RunList)
async def list_runs(
    store: StoreDep,
    caller: CallerDep,
    trigger_source: Annotated[str | None, Query(description="runs an event of this source started "
                                                "(eventbridge, s3-notification, sns, inbox)")] = None,
    trigger_bucket: Annotated[str | None, Query(description="runs an object of this bucket started")] = None,
    trigger_key: Annotated[str | None, Query(description="runs this object key (inbox: file name) started")] = None,
    state: Annotated[str | None, Query(description="only runs in this state (queued: the queue, in the order "
                                                    "its runs will start)")] = None,
    tenant: Annotated[str | None, Query(description="only this tenant's runs (a member sees only its own)")] = None,
    offset: Annotated[int, Query(ge=0, description="skip this many runs (oldest first)")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000, description="page size")] = 100,
) -> RunList:
    """The runs the caller may see, oldest first, a page at a time, without their configs (GET
    /v1/runs/{id} has them); with state=queued, the queue in its order, each run with its
    queue_position (its place among every tenant's queued runs)."""
    wanted = {k: v for k, v in (("source", trigger_source), ("bucket", trigger_bucket), ("key", trigger_key))
              if v is not None}
    if not caller.admin:
        tenant = caller.tenant if tenant in (None, caller.tenant) else "\0"  # another tenant's: none
    if wanted or state is not None or tenant is not None:
        listed = await store.queued_runs() if state == RunState.QUEUED else await store.list_runs()
        matching = [run for run in listed
                    if all((run["trigger"] or {}).get(k) == v for k, v in wanted.items())
                    and (state is None or run["state"] == state) and (tenant is None or run["tenant"] == tenant)]
        total, page = len(matching), matching[offset:offset + limit]
    else:
        total, page = await store.count_runs(), await store.list_runs(offset, limit)
    summaries = [RunSummary(**{k: v for k, v in run.items() if k != "config"}) for run in page]
    return RunList(runs=summaries, total=total, offset=offset, limit=limit)


@router.get("/{run_id}", response_model=Run, responses={404: RUN_RESPONSES[404]})
async def get_run(run: RunDep, store: StoreDep) -> Run:
    return await _with_latest(store, run)


@router.patch("/{run_id}", response_model=Run, responses=RUN_RESPONSES)
async def update_run(body: RunUpdate, run: RunDep, store: StoreDep, manager: ManagerDep) -> Run:
    """Changes a run's priority; a queued run moves to its new place in the queue (409 for a run that
    has ended)."""
    await manager.set_priority(run["id"], body.priority)
    return await _with_latest(store, await store.get_run(run["id"]))


@router.post("/{run_id}/{action}", response_model=Run, responses={**RUN_RESPONSES, **LIMIT_RESPONSES})
async def control_run(action: str, run: RunDep, store: StoreDep, manager: ManagerDep) -> Run:
    handlers = {"stop": manager.stop, "pause": manager.pause, "resume": manager.resume}
    if action not in handlers:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown action {action!r}: use stop, pause or resume")
    await handlers[action](run["id"])
    return await _with_latest(store, await store.get_run(run["id"]))


@router.get("/{run_id}/metrics", responses={404: RUN_RESPONSES[404]}, response_model=MetricsList)
async def run_metrics(run: RunDep, store: StoreDep) -> MetricsList:
    return MetricsList(metrics=await store.metrics(run["id"]))


@router.get("/{run_id}/evals", responses={404: RUN_RESPONSES[404]}, response_model=EvalList)
async def run_evals(run: RunDep, store: StoreDep) -> EvalList:
    return EvalList(evals=await store.evals(run["id"]))


@router.get("/{run_id}/episodes", responses={404: RUN_RESPONSES[404]}, response_model=EpisodeList)
async def run_episodes(
    run: RunDep, store: StoreDep,
    kind: Annotated[str | None, Query(description="train or eval")] = None,
    step: Annotated[int | None, Query(ge=0)] = None,
    solved: Annotated[bool | None, Query(description="only solved (true) or unsolved (false) episodes")] = None,
    seed: Annotated[int | None, Query(ge=0, description="only episodes of this task (maze seed)")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> EpisodeList:
    wanted = {"kind": kind, "step": step, "solved": solved, "seed": seed}
    episodes = [e for e in await store.episodes(run["id"])
                if all(value is None or e.get(name) == value for name, value in wanted.items())]
    return EpisodeList(episodes=episodes[:limit])


@router.get("/{run_id}/episodes/{episode_id}", responses={404: RUN_RESPONSES[404]})
async def run_episode(episode_id: str, run: RunDep, store: StoreDep) -> dict:  # type: ignore[type-arg]
    episode = await store.episode(run["id"], episode_id)
    if episode is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"episode {episode_id!r} not found in run {run['id']!r}")
    return episode


@router.get("/{run_id}/events", responses={404: RUN_RESPONSES[404]})
async def run_events(
    run: RunDep, store: StoreDep,
    follow: Annotated[bool, Query(description="keep streaming until the run ends")] = True,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    """Server-sent events: state changes, steps, evals, adapter versions."""
    if last_event_id is not None and not _EVENT_ID.fullmatch(last_event_id):
        raise HTTPException(status.HTTP_400_BAD_REQUEST,
                            f"Last-Event-ID must be an event id such as 1700000000000-0, got {shown(last_event_id)}")

    async def stream() -> AsyncIterator[str]:
        after = last_event_id or "0"
        while True:
            events = await store.read_events(run["id"], after=after, block_ms=1000 if follow else 1)
            for event_id, event in events:
                after = event_id
                yield f"id: {event_id}\nevent: {event['kind']}\ndata: {json.dumps(event['data'])}\n\n"
            if events:
                continue
            if not follow or (await store.get_run(run["id"]))["state"] in TERMINAL:
                return
            yield ": keep-alive\n\n"
            await asyncio.sleep(0)

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})
