"""The gRPC RolloutService on a real grpc.aio server (port 0) over the in-process engine: status codes,
health before/after the engine and when it dies, reflection, adapter version reporting."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from mmrl.models.tiny_adapter import frame_png
from mmrl_proto.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from services.common.grpc_server import channel
from services.rollout.config import RolloutConfig
from services.rollout.engine import Engine
from services.rollout.frames import FrameCache
from services.rollout.service import SERVICE_NAME, RolloutServer
from tests.rollout.fake_engine import IMAGE_TOKEN, FakeEngine
from tests.rollout.test_adapters import publish

CONFIG = RolloutConfig(model="fake", max_model_len=128, health_interval_s=0.05, health_timeout_s=1.0)


@dataclass
class Service:
    server: RolloutServer
    stub: rollout_pb2_grpc.RolloutServiceStub
    health: health_pb2_grpc.HealthStub
    channel: grpc.aio.Channel
    engine: FakeEngine
    shared: Path


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    shared, cache = tmp_path / "shared", tmp_path / "cache"
    shared.mkdir()
    cache.mkdir()
    server = await RolloutServer.start(CONFIG, "127.0.0.1:0", shared_root=shared, cache_dir=cache)
    async with channel(f"127.0.0.1:{server.port}") as ch:
        yield Service(server, rollout_pb2_grpc.RolloutServiceStub(ch), health_pb2_grpc.HealthStub(ch), ch,
                      FakeEngine(), shared)
    await server.close()
    await server.running.stop(grace_s=0)


async def _attach(service: Service) -> None:
    async def factory(config: RolloutConfig) -> Engine:
        return service.engine

    await service.server.start_engine(factory)


async def _status(service: Service, name: str = SERVICE_NAME) -> int:
    reply = await service.health.Check(health_pb2.HealthCheckRequest(service=name))
    return int(reply.status)


def _request(version: int = 0, run_id: str = "", max_tokens: int = 3) -> rollout_pb2.GenerationRequest:
    return rollout_pb2.GenerationRequest(
        prompt_token_ids=[1, 2, IMAGE_TOKEN, 3], images=[common_pb2.Image(data=frame_png(1), mime_type="image/png")],
        sampling=rollout_pb2.SamplingParams(temperature=1.0, max_tokens=max_tokens, n=2), adapter_run_id=run_id,
        adapter_version=version)


async def _code(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    return info.value.code()


async def test_health_is_not_serving_until_the_engine_is_up_and_calls_are_unavailable(service: Service) -> None:
    assert await _status(service) == health_pb2.HealthCheckResponse.NOT_SERVING
    assert await _status(service, "") == health_pb2.HealthCheckResponse.NOT_SERVING
    assert await _code(service.stub.Generate(rollout_pb2.GenerateRequest(requests=[_request()]))) \
        == grpc.StatusCode.UNAVAILABLE
    await _attach(service)
    assert await _status(service) == health_pb2.HealthCheckResponse.SERVING


async def test_health_turns_not_serving_when_the_engine_dies(service: Service) -> None:
    await _attach(service)
    service.engine.dead = True
    for _ in range(100):
        if await _status(service) == health_pb2.HealthCheckResponse.NOT_SERVING:
            break
        await asyncio.sleep(0.02)
    assert await _status(service) == health_pb2.HealthCheckResponse.NOT_SERVING
    assert await _code(service.stub.Generate(rollout_pb2.GenerateRequest(requests=[_request()]))) \
        == grpc.StatusCode.UNAVAILABLE


async def test_generate_returns_results_in_request_order_with_the_adapter_version_used(service: Service) -> None:
    await _attach(service)
    publish(service.shared, "run", 7)
    loaded = await service.stub.LoadAdapter(rollout_pb2.LoadAdapterRequest(run_id="run", version=7))
    assert loaded.version == 7 and len(loaded.manifest_sha256) == 64
    reply = await service.stub.Generate(rollout_pb2.GenerateRequest(
        requests=[_request(), _request(7, "run"), _request(max_tokens=1)]))
    assert [r.adapter_version for r in reply.results] == [0, 7, 0]
    assert [len(r.completions) for r in reply.results] == [2, 2, 2]
    assert len(reply.results[2].completions[0].token_ids) == 1
    assert list(reply.results[0].prompt_token_ids) == [1, 2] + [IMAGE_TOKEN] * 4 + [3]
    assert list(reply.results[0].completions[0].logprobs) == [-1.0] * 3
    (listed,) = (await service.stub.ListAdapters(rollout_pb2.ListAdaptersRequest())).adapters
    assert (listed.run_id, listed.version, listed.manifest_sha256) == ("run", 7, loaded.manifest_sha256)
    released = await service.stub.ReleaseAdapters(rollout_pb2.ReleaseAdaptersRequest(run_id="run"))
    assert released.released == 1
    assert not (await service.stub.ListAdapters(rollout_pb2.ListAdaptersRequest())).adapters
    assert await _code(service.stub.Generate(rollout_pb2.GenerateRequest(requests=[_request(7, "run")]))) \
        == grpc.StatusCode.NOT_FOUND


async def test_a_frame_sent_again_is_not_decoded_again_and_reaches_the_engine_with_its_digest(
        service: Service, caplog: pytest.LogCaptureFixture) -> None:
    await _attach(service)
    caplog.set_level(logging.INFO, logger="mmrl.rollout")
    for _ in range(2):
        await service.stub.Generate(rollout_pb2.GenerateRequest(requests=[_request(), _request()]))
    logged = [(r.__dict__["rollout/generate/num_images"], r.__dict__["rollout/generate/images_decoded"])
              for r in caplog.records if r.getMessage() == "generated"]
    assert logged == [(2, 1), (2, 0)]
    first, second = (call[0] for call in service.engine.calls)
    assert first.image_ids == second.image_ids == [FrameCache(0).decode(frame_png(1)).digest]
    assert first.images[0] is second.images[0]


async def test_refusals_carry_their_status_code_and_leave_the_service_serving(service: Service) -> None:
    await _attach(service)
    stub = service.stub
    assert await _code(stub.Generate(rollout_pb2.GenerateRequest(requests=[_request(3, "run")]))) \
        == grpc.StatusCode.NOT_FOUND
    assert await _code(stub.LoadAdapter(rollout_pb2.LoadAdapterRequest(run_id="run", version=1, path="/etc"))) \
        == grpc.StatusCode.INVALID_ARGUMENT
    tampered = publish(service.shared, "run", 1)
    (tampered / "adapter_config.json").write_text("{}")
    assert await _code(stub.LoadAdapter(rollout_pb2.LoadAdapterRequest(run_id="run", version=1))) \
        == grpc.StatusCode.FAILED_PRECONDITION
    assert await _code(stub.Sleep(rollout_pb2.SleepRequest(level=1))) == grpc.StatusCode.FAILED_PRECONDITION
    bad = _request()
    bad.images[0].data = b"nope"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Generate(rollout_pb2.GenerateRequest(requests=[_request(), bad]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith("requests[1].images[0]: cannot decode")
    assert await _status(service) == health_pb2.HealthCheckResponse.SERVING
    assert len((await stub.Generate(rollout_pb2.GenerateRequest(requests=[_request()]))).results) == 1


async def test_model_info_and_reflection_describe_the_service(service: Service) -> None:
    await _attach(service)
    info = await service.stub.GetModelInfo(rollout_pb2.GetModelInfoRequest())
    assert (info.model, info.max_model_len, info.vocab_size, info.sleep_supported) == ("fake", 128, 512, False)
    assert info.max_adapter_runs == CONFIG.max_adapter_runs
    reflection = reflection_pb2_grpc.ServerReflectionStub(service.channel)
    replies = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = [s.name async for reply in replies for s in reply.list_services_response.service]
    assert SERVICE_NAME in names


async def test_closing_shuts_the_engine_down(service: Service) -> None:
    await _attach(service)
    await service.server.close()
    assert service.engine.closed
    assert await _status(service) == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_generate_while_asleep_is_a_failed_precondition_until_wake_up(service: Service) -> None:
    service.engine = FakeEngine(sleep_supported=True)
    await _attach(service)
    await service.stub.Sleep(rollout_pb2.SleepRequest())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await service.stub.Generate(rollout_pb2.GenerateRequest(requests=[_request()]))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # not UNAVAILABLE: retrying cannot help
    assert "call WakeUp first" in (info.value.details() or "")
    await service.stub.WakeUp(rollout_pb2.WakeUpRequest())
    assert len((await service.stub.Generate(rollout_pb2.GenerateRequest(requests=[_request()]))).results) == 1
    assert service.engine.sleep_levels == [1] and service.engine.wake_ups == 1


async def test_sleep_and_wake_up_again_in_the_same_state_leave_the_engine_alone(service: Service) -> None:
    service.engine = FakeEngine(sleep_supported=True)
    await _attach(service)
    await service.stub.WakeUp(rollout_pb2.WakeUpRequest())  # awake already: a restarted coordinator's WakeUp
    for _ in range(2):
        await service.stub.Sleep(rollout_pb2.SleepRequest())
    for _ in range(2):
        await service.stub.WakeUp(rollout_pb2.WakeUpRequest())
    assert (service.engine.sleep_levels, service.engine.wake_ups) == ([1], 1)


async def test_sleep_level_2_is_refused_because_wake_up_would_not_reload_the_weights(service: Service) -> None:
    service.engine = FakeEngine(sleep_supported=True)
    await _attach(service)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await service.stub.Sleep(rollout_pb2.SleepRequest(level=2))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith("sleep level must be 1 (0 means 1), got 2")
    assert service.engine.sleep_levels == []
    assert len((await service.stub.Generate(rollout_pb2.GenerateRequest(requests=[_request()]))).results) == 1


async def test_load_adapter_while_asleep_is_refused_because_its_probe_needs_the_engine(service: Service) -> None:
    service.engine = FakeEngine(sleep_supported=True)
    await _attach(service)
    publish(service.shared, "run", 1)
    await service.stub.Sleep(rollout_pb2.SleepRequest())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await service.stub.LoadAdapter(rollout_pb2.LoadAdapterRequest(run_id="run", version=1))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "adapter probe needs it awake; call WakeUp first" in (info.value.details() or "")
    await service.stub.WakeUp(rollout_pb2.WakeUpRequest())
    loaded = await service.stub.LoadAdapter(rollout_pb2.LoadAdapterRequest(run_id="run", version=1))
    assert loaded.version == 1


async def test_load_adapter_with_lora_disabled_is_a_failed_precondition(service: Service) -> None:
    service.engine = FakeEngine(lora_supported=False)
    await _attach(service)
    publish(service.shared, "run", 1)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await service.stub.LoadAdapter(rollout_pb2.LoadAdapterRequest(run_id="run", version=1))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "enable_lora=false" in (info.value.details() or "")


async def test_a_failed_unload_of_a_retired_adapter_still_returns_the_results(service: Service) -> None:
    await _attach(service)
    for version in (1, 2):
        publish(service.shared, "run", version)
        await service.stub.LoadAdapter(rollout_pb2.LoadAdapterRequest(run_id="run", version=version))
    service.engine.hold = asyncio.Event()
    call = asyncio.ensure_future(service.stub.Generate(rollout_pb2.GenerateRequest(
        requests=[_request(1, "run"), _request(2, "run")])))
    while not service.engine.calls:
        await asyncio.sleep(0.01)
    for version in (3, 4):  # retires v1 and v2 while the call still uses them
        publish(service.shared, "run", version)
        await service.stub.LoadAdapter(rollout_pb2.LoadAdapterRequest(run_id="run", version=version))
    (v1,) = [ref for ref in service.engine.adapters.values() if ref.version == 1]
    service.engine.failing_removals.add(v1.lora_int_id)
    service.engine.hold.set()
    reply = await call
    assert [r.adapter_version for r in reply.results] == [1, 2]
    assert sorted(ref.version for ref in service.engine.adapters.values()) == [1, 3, 4]  # v2 unloaded all the same


async def _a_held_generate(service: Service) -> asyncio.Future[rollout_pb2.GenerateResponse]:
    """A Generate call that stays in the engine until `service.engine.hold` is set."""
    service.engine.hold = asyncio.Event()
    before = len(service.engine.calls)
    running = asyncio.ensure_future(service.stub.Generate(rollout_pb2.GenerateRequest(requests=[_request()])))
    while len(service.engine.calls) == before:
        await asyncio.sleep(0.01)
    return running


async def test_a_sleep_waits_for_running_generate_calls_and_refuses_new_ones(service: Service) -> None:
    service.engine = FakeEngine(sleep_supported=True)
    await _attach(service)
    running = await _a_held_generate(service)
    sleeping = asyncio.ensure_future(service.stub.Sleep(rollout_pb2.SleepRequest()))
    await asyncio.sleep(0.1)
    assert not sleeping.done() and service.engine.sleep_levels == []  # vLLM's sleep would abort the call
    assert await _code(service.stub.Generate(rollout_pb2.GenerateRequest(requests=[_request()]))) \
        == grpc.StatusCode.FAILED_PRECONDITION
    service.engine.hold.set()
    assert len((await running).results) == 1
    await sleeping
    assert service.engine.sleep_levels == [1]


async def test_a_wake_up_or_second_sleep_during_a_waiting_sleep_comes_after_it(service: Service) -> None:
    service.engine = FakeEngine(sleep_supported=True)
    await _attach(service)
    running = await _a_held_generate(service)
    first = asyncio.ensure_future(service.stub.Sleep(rollout_pb2.SleepRequest()))
    second = asyncio.ensure_future(service.stub.Sleep(rollout_pb2.SleepRequest()))
    await asyncio.sleep(0.1)
    assert not (first.done() or second.done())  # both wait for the running call, the second for the first
    service.engine.hold.set()  # type: ignore[union-attr]
    await asyncio.gather(running, first, second)
    assert service.engine.sleep_levels == [1]  # asleep once: the second Sleep found it asleep
    await service.stub.WakeUp(rollout_pb2.WakeUpRequest())

    running = await _a_held_generate(service)
    sleeping = asyncio.ensure_future(service.stub.Sleep(rollout_pb2.SleepRequest()))
    await asyncio.sleep(0.1)
    waking = asyncio.ensure_future(service.stub.WakeUp(rollout_pb2.WakeUpRequest()))
    await asyncio.sleep(0.1)
    assert not (sleeping.done() or waking.done())  # the WakeUp waits for the Sleep, which waits for the call
    service.engine.hold.set()  # type: ignore[union-attr]
    await asyncio.gather(running, sleeping, waking)
    assert (service.engine.sleep_levels, service.engine.wake_ups) == ([1, 1], 2)  # slept, then woke
    service.engine.hold = None
    assert len((await service.stub.Generate(rollout_pb2.GenerateRequest(requests=[_request()]))).results) == 1


async def test_a_sleep_given_up_while_it_waits_leaves_the_engine_awake_and_serving(service: Service) -> None:
    service.engine = FakeEngine(sleep_supported=True)
    await _attach(service)
    running = await _a_held_generate(service)
    assert await _code(service.stub.Sleep(rollout_pb2.SleepRequest(), timeout=0.2)) == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.sleep(0.2)  # past the server's deadline too (it counts from receipt); whichever the server
    service.engine.hold.set()  # sees first, the end of the Generate or the expiry, the engine must stay awake
    await running
    service.engine.hold = None
    assert len((await service.stub.Generate(rollout_pb2.GenerateRequest(requests=[_request()]))).results) == 1
    assert service.engine.sleep_levels == []


class _ExpiredContext:
    """A servicer context whose caller's deadline has passed, though the server has not cancelled
    the handler yet (a Generate ending can wake the Sleep first)."""

    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def time_remaining(self) -> float:
        return 0.0

    def cancelled(self) -> bool:
        return False

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise grpc.RpcError(details)


async def test_a_sleep_whose_deadline_passed_while_it_waited_does_not_put_the_engine_to_sleep(
    service: Service,
) -> None:
    service.engine = FakeEngine(sleep_supported=True)
    await _attach(service)
    context = _ExpiredContext()
    with pytest.raises(grpc.RpcError):
        await service.server.servicer.Sleep(rollout_pb2.SleepRequest(), context)  # type: ignore[arg-type]
    assert context.aborted is not None and context.aborted[0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert service.engine.sleep_levels == []
    assert len((await service.stub.Generate(rollout_pb2.GenerateRequest(requests=[_request()]))).results) == 1
