"""Run state transitions against a real Redis: each decision rests on the run as it is when written."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis

from services.coordinator.config import CoordinatorSettings
from services.coordinator.grpo.runloop import serve_request
from services.coordinator.ops.manager import RunManager, TransitionError
from services.coordinator.ops.store import RunState

CONFIG = {"name": "transitions", "model": "some/model", "steps": 2}


async def _paused_run(store: Any) -> None:
    await store.create_run("r1", "r", CONFIG, 2)
    await store.set_state("r1", RunState.PAUSED)


async def test_a_change_decided_on_a_state_written_meanwhile_is_decided_again(store: Any, redis_url: str) -> None:
    await store.create_run("r1", "r", CONFIG, 2)
    other = redis.Redis.from_url(f"{redis_url}/1", decode_responses=True)  # the run loop, say
    seen: list[str] = []

    def decide(run: dict[str, Any]) -> dict[str, Any]:
        seen.append(run["state"])
        if len(seen) == 1:  # between this read and the write, another client ends the run
            other.hset("mmrl:run:r1", mapping={"state": "succeeded"})
        return {} if run["state"] == "succeeded" else {"desired": "pause"}

    assert await store.change_run("r1", decide) == {}
    assert seen == ["queued", "succeeded"]
    assert (await store.get_run("r1"))["desired"] == ""
    other.close()


async def test_a_refused_change_writes_nothing_and_a_state_change_is_an_event(store: Any) -> None:
    await _paused_run(store)

    def refuse(run: dict[str, Any]) -> dict[str, Any]:
        raise TransitionError("no")

    run_before, before = await store.get_run("r1"), await store.read_events("r1", block_ms=1)
    with pytest.raises(TransitionError):
        await store.change_run("r1", refuse)
    assert await store.get_run("r1") == run_before  # updated_at included
    assert await store.read_events("r1", block_ms=1) == before
    await store.change_run("r1", lambda run: serve_request({**run, "desired": "stop"}))
    assert (await store.get_run("r1"))["state"] == "stopped"
    after = await store.read_events("r1", block_ms=1)
    assert after[len(before):][0][1]["data"] == {"state": "stopped", "reason": ""}


def test_a_step_boundary_serves_a_stop_and_a_pause_whose_checkpoint_is_saved() -> None:
    assert serve_request({"desired": "pause"}) == {"state": "paused", "failure_reason": "", "desired": ""}
    assert serve_request({"desired": "stop"}) == {"state": "stopped", "failure_reason": "", "desired": ""}
    assert serve_request({"desired": ""}) == {}
    # a pause that came after the loop looked: not before the last step's checkpoint (the loop saves it)
    assert serve_request({"desired": "pause"}, checkpointed=False) == {}
    assert serve_request({"desired": "stop"}, checkpointed=False)["state"] == "stopped"


async def test_a_stop_after_the_loop_has_paused_the_run_stops_it(store: Any, tmp_path: Path) -> None:
    manager = RunManager(store, CoordinatorSettings(shared_root=tmp_path, resume_runs=False))
    await _paused_run(store)  # the loop has just paused the run; its task is still ending
    manager.learners["r1"] = manager.settings.pools[0]  # launched here
    ending = asyncio.Event()

    async def loop_ending() -> None:
        await ending.wait()

    manager.tasks["r1"] = asyncio.create_task(loop_ending())
    await manager.stop("r1")
    run = await store.get_run("r1")
    assert (run["state"], run["desired"]) == ("stopped", "")  # nothing would serve a desired stop now
    ending.set()
    await manager.tasks["r1"]


async def test_a_resume_gives_way_to_a_stop_that_lands_while_it_decides(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = RunManager(store, CoordinatorSettings(shared_root=tmp_path, resume_runs=False))
    await _paused_run(store)
    read_run = store.get_run

    async def read_then_stopped(run_id: str) -> dict[str, Any]:
        run = await read_run(run_id)
        await manager.stop(run_id)  # a stop request served between resume's check and its write
        return run

    monkeypatch.setattr(store, "get_run", read_then_stopped)
    with pytest.raises(TransitionError, match="stopped"):
        await manager.resume("r1")
    assert (await read_run("r1"))["state"] == "stopped"
    assert not manager.is_active("r1") and "r1" not in manager.learners  # not launched, learner free


async def test_a_restarted_coordinator_does_not_relaunch_a_run_stopped_since_it_listed_the_runs(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = RunManager(store, CoordinatorSettings(shared_root=tmp_path, resume_runs=False))
    await store.create_run("r1", "r", CONFIG, 2)
    await store.set_state("r1", RunState.RUNNING)  # left running by a coordinator that went away
    listing = await store.list_runs()
    await manager.stop("r1")  # no task holds it yet: stopped at once
    monkeypatch.setattr(store, "list_runs", lambda: asyncio.sleep(0, result=listing))
    assert await manager.resume_left_running() == []
    assert (await store.get_run("r1"))["state"] == "stopped"
    assert not manager.is_active("r1") and "r1" not in manager.learners


async def test_a_failure_is_recorded_once_redis_answers_again(tmp_path: Path) -> None:
    """A run whose failure went unrecorded (Redis down at that moment) would stay 'running' with
    nothing driving it: the manager retries the write."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    class FlakyStore:
        r = None  # no leases taken here

        def __init__(self) -> None:
            self.calls: list[tuple[str, str, str]] = []

        async def set_state(self, run_id: str, state: str, reason: str) -> None:
            self.calls.append((run_id, state, reason))
            if len(self.calls) < 2:
                raise RedisConnectionError("Connection refused")

    store = FlakyStore()
    manager = RunManager(store, CoordinatorSettings(shared_root=tmp_path, service_wait_s=30))  # type: ignore[arg-type]
    await manager._fail("r1", "learner lost")
    assert store.calls == [("r1", RunState.FAILED, "learner lost")] * 2
