from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from services.common.procs import free_port, start_redis, stop_process


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
    from services.coordinator.store import RunStore

    store = RunStore.from_url(f"{redis_url}/1")
    await store.r.flushdb()
    yield store
    await store.close()
