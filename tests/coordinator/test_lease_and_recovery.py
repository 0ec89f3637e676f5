"""Leases (two coordinators on one real Redis), waiting out lost services, and replayed steps
announced once."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from services.coordinator.config import CoordinatorSettings, RunConfig
from services.coordinator.ops.clients import ServiceError
from services.coordinator.ops.manager import RunManager
from services.coordinator.ops.recovery import drive
from services.coordinator.ops.store import RunState, RunStore


async def _until(check: Any, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_two_coordinators_drive_a_run_one_at_a_time_and_the_survivor_adopts_it(
        store: RunStore, redis_url: str, tmp_path: Path, tiny_model_dir: Path, held_runs: threading.Event) -> None:
    def settings(name: str) -> CoordinatorSettings:
        return CoordinatorSettings(shared_root=tmp_path, instance_id=name, lease_ttl_s=1.0,
                                   allowed_models=str(tiny_model_dir))

    first = RunManager(store, settings("a"))
    other_store = RunStore.from_url(f"{redis_url}/1")
    second = RunManager(other_store, settings("b"))
    run = await first.create(RunConfig(model=str(tiny_model_dir), steps=2))
    run_id = run["id"]
    maintaining = [asyncio.create_task(m.maintain()) for m in (first, second)]
    try:
        await _until(lambda: _state_is(store, run_id, RunState.RUNNING))
        await asyncio.sleep(2.5)  # over two lease lifetimes: renewed by the first, never taken by the second
        assert first.is_active(run_id) and not second.is_active(run_id)
        assert await first.leases.holder(run_id) == "a"
        await second.pause(run_id)  # driven elsewhere: a request for its loop, not an immediate pause
        assert (await store.get_run(run_id))["desired"] == "pause"
        await second.resume(run_id)  # withdraws the pause
        assert (await store.get_run(run_id))["desired"] == ""

        # The first coordinator dies: nothing renews or releases its lease.
        maintaining[0].cancel()

        async def no_release(run_id: str) -> None:
            return None

        first.leases.release = no_release  # type: ignore[method-assign]
        await first.shutdown()
        await _until(lambda: _true(second.is_active(run_id)), timeout_s=5.0)
        assert await second.leases.holder(run_id) == "b"
        held_runs.set()
        await _until(lambda: _state_is(store, run_id, RunState.SUCCEEDED))
    finally:
        for task in maintaining:
            task.cancel()
        await asyncio.gather(*maintaining, return_exceptions=True)
        await second.shutdown()
        await other_store.close()


async def _state_is(store: RunStore, run_id: str, state: RunState) -> bool:
    return (await store.get_run(run_id))["state"] == state


async def _true(value: bool) -> bool:
    return value


class _Services:
    def __init__(self) -> None:
        self.waits = 0

    async def wait_healthy(self, timeout_s: float) -> None:
        self.waits += 1


async def test_an_env_that_lost_its_episodes_is_waited_for_and_the_run_redone(store: RunStore,
                                                                           tmp_path: Path) -> None:
    await store.create_run("r1", "r1", {}, 3)
    attempts: list[int] = []

    async def execute() -> RunState:
        attempts.append(1)
        if len(attempts) == 1:
            raise ServiceError("env", "127.0.0.1:1", "Step", "NOT_FOUND", "unknown episode 'e-1'")
        return RunState.SUCCEEDED

    services = _Services()
    settings = CoordinatorSettings(shared_root=tmp_path, service_wait_s=5, run_restarts=3)
    assert await drive("r1", execute, services, store, settings) == RunState.SUCCEEDED  # type: ignore[arg-type]
    assert len(attempts) == 2 and services.waits == 1
    events = [e["kind"] for _, e in await store.read_events("r1", block_ms=1)]
    assert "restart" in events


async def test_a_bad_request_fails_at_once_and_a_lost_service_without_progress_after_the_restarts(
        store: RunStore, tmp_path: Path) -> None:
    await store.create_run("r2", "r2", {}, 3)
    settings = CoordinatorSettings(shared_root=tmp_path, service_wait_s=5, run_restarts=2)
    for code, service, tries in (("INVALID_ARGUMENT", "env", 1), ("UNAVAILABLE", "learner", 3),
                                 ("NOT_FOUND", "rollout", 3), ("DEADLINE_EXCEEDED", "learner", 3)):
        attempts: list[int] = []

        async def execute(code: str = code, service: str = service, attempts: list[int] = attempts) -> RunState:
            attempts.append(1)
            raise ServiceError(service, "127.0.0.1:1", "Call", code, "no")

        try:
            await drive("r2", execute, _Services(), store, settings)  # type: ignore[arg-type]
        except ServiceError as exc:
            assert exc.code == code
        else:
            raise AssertionError("the run should have failed")
        assert len(attempts) == tries, code


async def test_a_replayed_step_is_recorded_again_but_announced_once(store: RunStore) -> None:
    await store.create_run("r3", "r3", {}, 3)
    for step in (1, 2):
        await store.commit_step("r3", step, {"step": step, "reward/mean": 0.0}, {})
    await store.record_eval("r3", 2, {"step": 2}, {})
    await store.truncate_after("r3", 1)  # a restart from the checkpoint of step 1
    await store.commit_step("r3", 2, {"step": 2, "reward/mean": 1.0}, {})
    await store.record_eval("r3", 2, {"step": 2}, {})
    await store.commit_step("r3", 3, {"step": 3, "reward/mean": 1.0}, {})
    kinds = [(e["kind"], e["data"].get("step")) for _, e in await store.read_events("r3", block_ms=1)]
    assert [k for k in kinds if k[0] == "step"] == [("step", 1), ("step", 2), ("step", 3)]
    assert [k for k in kinds if k[0] == "eval"] == [("eval", 2)]
    assert [m["reward/mean"] for m in await store.metrics("r3")] == [0.0, 1.0, 1.0]  # the replay's record
