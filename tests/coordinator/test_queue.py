"""The run queue on a real Redis: a run that cannot start now is queued and starts when a learner
pool is free, by priority then in the order runs came; a queued run can be stopped or re-prioritised;
two coordinators never start one run; runs spread over several pools."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from services.common.procs import free_port
from services.coordinator.api.app import create_app
from services.coordinator.config import CoordinatorSettings
from services.coordinator.grpo.runloop import RunContext
from services.coordinator.ops.lease import Leases
from services.coordinator.ops.queue import Scheduler
from services.coordinator.ops.store import RunState, RunStore

DB = 5


class Gate:
    """Runs that record the order they start in and run until released, each release once (no services)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.released: set[str] = set()
        self.lock = threading.Lock()

    def release(self, run_id: str) -> None:
        with self.lock:
            self.released.add(run_id)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    from services.coordinator.ops import manager as manager_module
    from services.coordinator.ops.replicas import Services

    gate = Gate()

    async def healthy(self: Services) -> None:
        return None

    async def gated(ctx: RunContext) -> RunState:
        gate.started.append(ctx.run_id)
        await ctx.store.set_state(ctx.run_id, RunState.RUNNING)
        while ctx.run_id not in gate.released:
            await asyncio.sleep(0.02)
        gate.released.discard(ctx.run_id)  # once: a run started again waits again
        await ctx.store.set_state(ctx.run_id, RunState.SUCCEEDED)
        return RunState.SUCCEEDED

    monkeypatch.setattr(Services, "require_healthy", healthy)
    monkeypatch.setattr(manager_module, "execute_run", gated)
    yield gate
    gate.released.update(gate.started)  # runs still held end with the test


def _settings(redis_url: str, tmp_path: Path, pools: int = 1) -> CoordinatorSettings:
    dead = [f"127.0.0.1:{free_port()}" for _ in range(2 + pools)]
    return CoordinatorSettings(redis_url=f"{redis_url}/{DB}", shared_root=tmp_path, env_addr=dead[0],
                               rollout_addrs=dead[1], learner_addrs=",".join(dead[2:]), rpc_timeout_s=5,
                               rpc_retries=0, resume_runs=False, allowed_models="some/model")


@pytest.fixture
def client(redis_url: str, tmp_path: Path, tiny_model_dir: Path) -> Iterator[TestClient]:
    redis.Redis.from_url(f"{redis_url}/{DB}").flushdb()
    settings = _settings(redis_url, tmp_path).model_copy(update={"allowed_models": str(tiny_model_dir)})
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _post(client: TestClient, name: str, model: Path, **body: Any) -> dict[str, Any]:
    reply = client.post("/v1/runs", json={"config": {"name": name, "model": str(model), "steps": 1}, **body})
    assert reply.status_code == 201, reply.text
    return dict(reply.json())


def _wait(client: TestClient, run_id: str, states: set[str], timeout_s: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (run := client.get(f"/v1/runs/{run_id}").json())["state"] not in states:
        assert time.monotonic() < deadline, f"run {run_id} never reached {states}: {run}"
        time.sleep(0.05)
    return dict(run)


def _queue(client: TestClient) -> list[tuple[str, int]]:
    return [(r["name"], r["queue_position"]) for r in client.get("/v1/runs", params={"state": "queued"}).json()["runs"]]


def test_a_run_posted_while_another_runs_is_queued_and_then_runs(client: TestClient, tiny_model_dir: Path,
                                                                 gate: Gate) -> None:
    first = _post(client, "first", tiny_model_dir)
    _wait(client, first["id"], {"running"})
    second = _post(client, "second", tiny_model_dir)
    assert (second["state"], second["queue_position"], second["learner"]) == ("queued", 1, "")
    assert _queue(client) == [("second", 1)]
    gate.release(first["id"])
    run = _wait(client, second["id"], {"running"})
    assert run["queue_position"] is None and run["learner"] == first["learner"]
    assert gate.started == [first["id"], second["id"]]
    events = client.get(f"/v1/runs/{second['id']}/events", params={"follow": False}).text
    assert events.index('"queued"') < events.index('"pending"') < events.index('"running"')


def test_the_queue_starts_runs_by_priority_then_in_the_order_they_came(client: TestClient, tiny_model_dir: Path,
                                                                       gate: Gate) -> None:
    holder = _post(client, "holder", tiny_model_dir)
    _wait(client, holder["id"], {"running"})
    ids = {name: _post(client, name, tiny_model_dir, **({"priority": priority} if priority is not None else {}))["id"]
           for name, priority in (("low-a", None), ("high-a", 5), ("low-b", 0), ("high-b", 5), ("urgent", 9))}
    assert _queue(client) == [("urgent", 1), ("high-a", 2), ("high-b", 3), ("low-a", 4), ("low-b", 5)]
    previous = holder["id"]
    for name in ("urgent", "high-a", "high-b", "low-a", "low-b"):
        gate.release(previous)
        _wait(client, ids[name], {"running"})
        previous = ids[name]
    gate.release(previous)
    assert gate.started == [holder["id"], *(ids[n] for n in ("urgent", "high-a", "high-b", "low-a", "low-b"))]


def test_a_queued_run_can_be_stopped_or_reprioritised_and_an_ended_one_cannot(
        client: TestClient, tiny_model_dir: Path, gate: Gate) -> None:
    holder = _post(client, "holder", tiny_model_dir)
    _wait(client, holder["id"], {"running"})
    a, b, c = (_post(client, name, tiny_model_dir)["id"] for name in ("a", "b", "c"))
    moved = client.patch(f"/v1/runs/{c}", json={"priority": 3})
    assert moved.status_code == 200 and (moved.json()["priority"], moved.json()["queue_position"]) == (3, 1)
    assert client.post(f"/v1/runs/{a}/pause").status_code == 409  # a queued run is stopped, not paused
    stopped = client.post(f"/v1/runs/{a}/stop")
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopped"
    assert _queue(client) == [("c", 1), ("b", 2)]
    assert client.patch(f"/v1/runs/{a}", json={"priority": 1}).status_code == 409
    assert client.patch(f"/v1/runs/{b}", json={"priority": 5000}).status_code == 422
    assert client.patch("/v1/runs/nope", json={"priority": 1}).status_code == 404
    gate.release(holder["id"])
    _wait(client, c, {"running"})
    assert gate.started == [holder["id"], c]


def test_a_paused_run_resumed_while_its_pool_is_busy_waits_in_the_queue(
        client: TestClient, tiny_model_dir: Path, redis_url: str, gate: Gate) -> None:
    paused = _post(client, "paused", tiny_model_dir)
    _wait(client, paused["id"], {"running"})
    gate.release(paused["id"])
    _wait(client, paused["id"], {"succeeded"})
    redis.Redis.from_url(f"{redis_url}/{DB}").hset(f"mmrl:run:{paused['id']}", "state", "paused")  # as a pause ends
    other = _post(client, "other", tiny_model_dir)
    _wait(client, other["id"], {"running"})
    resumed = client.post(f"/v1/runs/{paused['id']}/resume")
    assert resumed.status_code == 200 and (resumed.json()["state"], resumed.json()["queue_position"]) == ("queued", 1)
    gate.release(other["id"])
    _wait(client, paused["id"], {"running"})
    assert gate.started == [paused["id"], other["id"], paused["id"]]


def test_runs_spread_over_the_free_pools_and_a_pinned_run_waits_for_its_own(
        redis_url: str, tmp_path: Path, tiny_model_dir: Path, gate: Gate) -> None:
    redis.Redis.from_url(f"{redis_url}/{DB}").flushdb()
    settings = _settings(redis_url, tmp_path, pools=2).model_copy(update={"allowed_models": str(tiny_model_dir)})
    with TestClient(create_app(settings)) as client:
        a, b = (_wait(client, _post(client, n, tiny_model_dir)["id"], {"running"}) for n in ("a", "b"))
        assert {a["learner"], b["learner"]} == set(settings.pools)
        pinned = _post(client, "pinned", tiny_model_dir,
                       config={"name": "pinned", "model": str(tiny_model_dir), "steps": 1,
                               "endpoints": {"learner": a["learner"]}})
        loose = _post(client, "loose", tiny_model_dir)
        gate.release(b["id"])  # b's pool frees: the pinned run keeps waiting, the one behind it starts there
        assert _wait(client, loose["id"], {"running"})["learner"] == b["learner"]
        assert client.get(f"/v1/runs/{pinned['id']}").json()["state"] == "queued"
        gate.release(a["id"])
        assert _wait(client, pinned["id"], {"running"})["learner"] == a["learner"]


def test_a_colocated_run_is_refused_where_pools_share_the_rollout_replicas(
        redis_url: str, tmp_path: Path, tiny_model_dir: Path) -> None:
    settings = _settings(redis_url, tmp_path, pools=2).model_copy(update={"allowed_models": str(tiny_model_dir)})
    with TestClient(create_app(settings)) as client:
        reply = client.post("/v1/runs", json={"config": {"model": str(tiny_model_dir), "colocated": True}})
    assert reply.status_code == 422
    assert "2 learner pools" in reply.json()["detail"][0]["msg"]


async def test_two_coordinators_never_start_one_run_nor_put_two_runs_on_one_pool(store: RunStore) -> None:
    pools = [f"10.0.0.{i}:50053" for i in range(3)]
    for i in range(12):
        await store.create_run(f"r{i:02d}", "r", {"name": "r"}, 1)
    schedulers = [Scheduler(store.r, Leases(store.r, owner, 30)) for owner in ("c1", "c2")]

    async def drain(scheduler: Scheduler) -> list[tuple[str, str]]:
        taken = []
        while (run := await scheduler.take(pools)) is not None:
            taken.append(run)
        return taken

    first, second = await asyncio.gather(*(drain(s) for s in schedulers))
    taken = first + second
    assert sorted(learner for _, learner in taken) == sorted(pools)  # each pool once, then none free
    assert [run for run, _ in sorted(taken)] == ["r00", "r01", "r02"]  # the queue's head
    for run_id, learner in taken:
        run = await store.get_run(run_id)
        assert (run["state"], run["learner"], run["queue_position"]) == ("pending", learner, None)
        owner = "c1" if (run_id, learner) in first else "c2"
        assert await Leases(store.r, owner, 30).holder(run_id) == owner
    assert [r["id"] for r in await store.queued_runs()] == [f"r{i:02d}" for i in range(3, 12)]
    await store.set_state("r01", RunState.SUCCEEDED)  # frees its pool; the claim key is left behind
    [(run_id, learner)] = [await schedulers[1].take(pools)]
    assert run_id == "r03" and learner == dict(taken)["r01"]


async def test_a_tenant_at_its_running_limit_waits_without_holding_up_the_others(store: RunStore) -> None:
    for run_id, tenant in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        await store.create_run(run_id, "r", {"name": "r"}, 1, tenant=tenant)
    scheduler = Scheduler(store.r, Leases(store.r, "c1", 30))
    pools = ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"]
    assert await scheduler.take(pools, {"a": 1}) == ("a1", pools[0])
    assert await scheduler.take(pools, {"a": 1}) == ("b1", pools[1])  # a2 waits: tenant a holds 1 pool
    assert await scheduler.take(pools, {"a": 1}) is None
    await store.set_state("a1", RunState.FAILED, "x")
    assert await scheduler.take(pools, {"a": 1}) == ("a2", pools[0])
