"""The run queue survives a coordinator killed with SIGKILL and a Redis restarted from its
append-only file: real `mmrl serve coordinator` processes and a real redis-server. The queue keeps
its runs, their order and positions, and the next coordinator starts them in that order once the
learner pool is free."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from services.common.procs import free_port, start_redis, stop_process
from services.coordinator.ops.store import RunStore
from tests.coordinator.coordinator_process import serve_coordinator

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


class Deployment:
    """One Redis (append-only) and one coordinator process at a time, on fixed ports."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.redis_port, self.api_port = free_port(), free_port()
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.pool = f"127.0.0.1:{free_port()}"  # nothing listens: a run that starts fails at once
        self.redis = start_redis(self.redis_port, data_dir=tmp_path / "redis")
        self.coordinator: subprocess.Popen[bytes] | None = None

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def start_coordinator(self) -> None:
        env = {**os.environ, "MMRL_REDIS_URL": self.redis_url, "MMRL_SHARED_ROOT": str(self.tmp_path / "shared"),
               "MMRL_ENV_ADDR": f"127.0.0.1:{free_port()}", "MMRL_ROLLOUT_ADDRS": f"127.0.0.1:{free_port()}",
               "MMRL_LEARNER_ADDRS": self.pool, "MMRL_ALLOWED_MODELS": "some/model", "MMRL_LEASE_TTL_S": "1.5",
               "MMRL_INSTANCE_ID": f"coordinator-{time.monotonic_ns()}", "MMRL_RPC_RETRIES": "0",
               "MMRL_TRIGGER_INBOX_POLL_S": "0"}
        self.coordinator = serve_coordinator(env, self.api_port)

    def kill_coordinator(self) -> None:
        assert self.coordinator is not None
        os.killpg(self.coordinator.pid, signal.SIGKILL)
        self.coordinator.wait()

    def restart_redis(self) -> None:
        os.killpg(self.redis.pid, signal.SIGKILL)
        self.redis.wait()
        self.redis = start_redis(self.redis_port, data_dir=self.tmp_path / "redis")

    def stop(self) -> None:
        if self.coordinator is not None and self.coordinator.poll() is None:
            stop_process(self.coordinator)
        stop_process(self.redis)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    deployment = Deployment(tmp_path)
    yield deployment
    deployment.stop()


def _hold_the_pool(deployment: Deployment) -> None:
    """A run another coordinator drives on the only pool (its lease held elsewhere for a minute)."""
    r = redis.Redis.from_url(deployment.redis_url, decode_responses=True)
    r.hset("mmrl:run:holder", mapping={"id": "holder", "name": "holder", "state": "running", "config": "{}",
                                       "step": 1, "steps": 9, "created_at": 0, "updated_at": 0,
                                       "learner": deployment.pool})
    r.zadd("mmrl:runs", {"holder": 0})
    r.set(f"mmrl:learner:{deployment.pool}", "holder")
    r.set("mmrl:run:holder:lease", "elsewhere", px=60_000)


def _queue(api: str) -> list[tuple[str, int, int]]:
    runs = httpx.get(f"{api}/v1/runs", params={"state": "queued"}, timeout=10).json()["runs"]
    return [(r["name"], r["priority"], r["queue_position"]) for r in runs]


async def _pending_times(redis_url: str, run_ids: list[str]) -> dict[str, float]:
    store = RunStore.from_url(redis_url)
    try:
        return {run_id: next(e["ts"] for _, e in await store.read_events(run_id, block_ms=1)
                             if e["kind"] == "state" and e["data"]["state"] == "pending") for run_id in run_ids}
    finally:
        await store.close()


def test_a_queue_survives_a_killed_coordinator_and_a_redis_restart_and_starts_in_its_order(
        deployment: Deployment) -> None:
    deployment.start_coordinator()
    _hold_the_pool(deployment)
    ids: dict[str, str] = {}
    for name, priority in (("later", 0), ("sooner", 2), ("last", -1), ("after-sooner", 2)):
        config: dict[str, Any] = {"name": name, "model": "some/model", "steps": 1, "priority": priority}
        reply = httpx.post(f"{deployment.api}/v1/runs", json={"config": config}, timeout=10)
        assert reply.status_code == 201 and reply.json()["state"] == "queued", reply.text
        ids[name] = reply.json()["id"]
    order = [("sooner", 2, 1), ("after-sooner", 2, 2), ("later", 0, 3), ("last", -1, 4)]
    assert _queue(deployment.api) == order

    deployment.kill_coordinator()
    deployment.restart_redis()
    deployment.start_coordinator()
    assert _queue(deployment.api) == order
    time.sleep(2)  # several scheduling rounds of the new coordinator: the pool is still held
    assert _queue(deployment.api) == order

    redis.Redis.from_url(deployment.redis_url).hset("mmrl:run:holder", "state", "succeeded")  # the pool frees
    deadline = time.monotonic() + 60
    while _queue(deployment.api):
        assert time.monotonic() < deadline, _queue(deployment.api)
        time.sleep(0.2)
    started = asyncio.run(_pending_times(deployment.redis_url, [ids[name] for name, *_ in order]))
    assert sorted(started, key=started.__getitem__) == [ids[name] for name, *_ in order]
    for name, *_ in order:  # each started and failed on the missing services, one after another
        run = httpx.get(f"{deployment.api}/v1/runs/{ids[name]}", timeout=10).json()
        assert run["state"] == "failed" and run["learner"] == deployment.pool, json.dumps(run)[:300]
