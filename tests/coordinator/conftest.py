from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

from mmrl_proto.v1 import env_pb2_grpc
from services.common.grpc_server import start_server
from services.common.procs import free_port, start_redis, stop_process
from services.coordinator.grpo.runloop import RunContext
from services.coordinator.ops.clients import CallPolicy, EnvClient
from services.coordinator.ops.replicas import Envs, Rollouts, Services
from services.env.config import EnvConfig
from services.env.maze.env import MazeEnv
from services.env.servicer import SERVICE_NAME, EnvServicer


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real redis-server on a free loopback port for the whole session."""
    port = free_port()
    proc = start_redis(port)
    yield f"redis://127.0.0.1:{port}"
    stop_process(proc)


@pytest.fixture
async def store(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[object]:
    """A RunStore on a flushed database (per-test isolation)."""
    from services.coordinator.ops.store import RunStore

    store = RunStore.from_url(f"{redis_url}/1")
    await store.r.flushdb()
    yield store
    await store.close()


@pytest.fixture
async def env_services() -> AsyncIterator[Services]:
    """Services whose env is a real env service on loopback (grpc.aio); no rollout or learner."""
    servicer = EnvServicer(MazeEnv(EnvConfig(max_live_episodes=64, max_batch=64)))
    running = await start_server(
        lambda server: env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, server), SERVICE_NAME, "127.0.0.1:0"
    )
    env = EnvClient(f"127.0.0.1:{running.port}", CallPolicy(retries=0))
    yield Services(env=Envs([env]), rollouts=Rollouts([]), learner=None)  # type: ignore[arg-type]
    await env.close()
    await running.stop(grace_s=0)


@pytest.fixture
def held_runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Runs whose services answer and whose loop waits until the event is set, then succeeds."""
    from services.coordinator.ops import manager as manager_module
    from services.coordinator.ops.replicas import Services
    from services.coordinator.ops.store import RunState

    release = threading.Event()

    async def healthy(self: Services) -> None:
        return None

    async def held(ctx: RunContext) -> RunState:
        await ctx.store.set_state(ctx.run_id, RunState.RUNNING)
        while not release.is_set():
            await asyncio.sleep(0.02)
        await ctx.store.set_state(ctx.run_id, RunState.SUCCEEDED)
        return RunState.SUCCEEDED

    monkeypatch.setattr(Services, "require_healthy", healthy)
    monkeypatch.setattr(manager_module, "execute_run", held)
    yield release
    release.set()
