"""The gRPC RolloutService: proto translation, adapter resolution, error codes, health.

A refused call is answered with `context.abort(code, message)` (see `errors.py`) and changes
nothing; the server keeps serving. Health (`grpc.health.v1`) says NOT_SERVING until the engine has
started and warmed up, and again as soon as a background probe finds the engine dead or unresponsive.

Sleep and Generate never overlap: from the moment a Sleep arrives, new Generate calls are refused
(FAILED_PRECONDITION) and the Sleep waits for the calls already running to finish, since vLLM's sleep
would abort them. LoadAdapter runs the adapter probe on the engine (services/rollout/adapters.py), so
with the probe on it is treated the same way. Sleep and WakeUp run one at a time: a WakeUp that arrives while a Sleep waits wakes
the engine once that Sleep is done, and a second Sleep returns only once the engine is asleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import grpc

from mmrl_proto.v1 import rollout_pb2, rollout_pb2_grpc
from services.common.grpc_server import RunningServer, start_server
from services.rollout import metrics
from services.rollout.adapters import AdapterRegistry, ProbePolicy
from services.rollout.config import RolloutConfig
from services.rollout.engine import Engine, EngineResult
from services.rollout.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    RolloutError,
    Unavailable,
)
from services.rollout.frames import FrameCache
from services.rollout.validation import parse_requests

SERVICE_NAME = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name  # "mmrl.v1.RolloutService"
log = logging.getLogger("mmrl.rollout")
T = TypeVar("T")
Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Coroutine[Any, Any, T]]


def _status_on_error(handler: Handler[T]) -> Handler[T]:
    """A RolloutError raised by the handler becomes the gRPC status it names."""

    @functools.wraps(handler)
    async def wrapped(self: Any, request: Any, context: grpc.aio.ServicerContext) -> T:
        try:
            return await handler(self, request, context)
        except RolloutError as error:
            metrics.ERRORS.labels(handler.__name__, error.code.name).inc()
            log.info("request refused", extra={"method": handler.__name__, "code": error.code.name,
                                               "reason": str(error)})
            await context.abort(error.code, str(error))
            raise AssertionError("context.abort returned") from error

    return wrapped


@dataclass
class Ready:
    engine: Engine
    adapters: AdapterRegistry


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    """RolloutService over an `Engine`; answers UNAVAILABLE until `attach` is called."""

    def __init__(self, config: RolloutConfig) -> None:
        self.config = config
        self._ready: Ready | None = None
        self._asleep = False  # the engine is (or, after a Sleep that failed midway, may be) asleep
        self._sleep_pending = False  # a Sleep waits for the running Generate calls: new ones are refused
        self._sleep_lock = asyncio.Lock()  # Sleep and WakeUp, one at a time
        self._generating = 0  # Generate calls (and probing LoadAdapter calls) in the engine
        self._generate_done = asyncio.Condition()
        self._frames = FrameCache(config.image_cache_mb * 2**20)  # an episode's frames come every turn

    def attach(self, engine: Engine, adapters: AdapterRegistry) -> None:
        self._ready = Ready(engine, adapters)

    def detach(self) -> None:
        self._ready = None

    @contextlib.asynccontextmanager
    async def _engine_in_use(self) -> AsyncIterator[None]:
        """Counts a call that runs on the engine, so that a Sleep waits for it; counted out whatever
        happens, or a waiting Sleep would wait forever."""
        self._generating += 1
        try:
            yield
        finally:
            self._generating -= 1
            async with self._generate_done:
                self._generate_done.notify_all()

    def _get_ready(self) -> Ready:
        if self._ready is None:
            raise Unavailable("the engine is still starting")
        return self._ready

    @_status_on_error
    async def Generate(self, request: rollout_pb2.GenerateRequest,
                       context: grpc.aio.ServicerContext) -> rollout_pb2.GenerateResponse:
        ready = self._get_ready()
        if self._asleep or self._sleep_pending:
            raise FailedPrecondition("the engine is asleep (Sleep was called); call WakeUp first")
        start = time.perf_counter()
        decoded_before = self._frames.misses
        parsed, keys = parse_requests(request.requests, ready.engine.info, self.config.max_requests_per_call,
                                      self.config.limit_images_per_prompt, self._frames)
        refs = ready.adapters.acquire(keys)
        async with self._engine_in_use():
            try:
                results = await ready.engine.generate(
                    [replace(r, adapter=ref) for r, ref in zip(parsed, refs, strict=True)])
            finally:
                await ready.adapters.release(refs)  # may unload retired adapters: before a waiting Sleep runs
        response = rollout_pb2.GenerateResponse()
        for result, ref in zip(results, refs, strict=True):
            _fill_result(response.results.add(), result, ref.version if ref is not None else 0)
        num_generated = sum(len(c.token_ids) for r in results for c in r.completions)
        metrics.generated(time.perf_counter() - start, len(results), num_generated)
        log.info("generated", extra={"rollout/generate/latency_ms": round((time.perf_counter() - start) * 1000, 1),
                                     "rollout/generate/num_requests": len(results),
                                     "rollout/generate/num_generated_tokens": num_generated,
                                     "rollout/generate/num_images": sum(len(r.images) for r in parsed),
                                     "rollout/generate/images_decoded": self._frames.misses - decoded_before})
        return response

    @_status_on_error
    async def LoadAdapter(self, request: rollout_pb2.LoadAdapterRequest,
                          context: grpc.aio.ServicerContext) -> rollout_pb2.LoadAdapterResponse:
        ready = self._get_ready()
        if not ready.engine.info.lora_supported:
            raise FailedPrecondition("this rollout service was started with enable_lora=false")
        probing = self.config.adapter_probe != "off"
        if probing and (self._asleep or self._sleep_pending):
            raise FailedPrecondition("the engine is asleep (Sleep was called) and the adapter probe needs it "
                                     "awake; call WakeUp first")
        # The probe runs on the engine: a Sleep waits for it as for a Generate call.
        async with self._engine_in_use() if probing else contextlib.nullcontext():
            adapter, load_ms = await ready.adapters.load(request.run_id, int(request.version), request.path)
        metrics.adapter_loaded(adapter.run_id, adapter.version, load_ms)
        return rollout_pb2.LoadAdapterResponse(run_id=adapter.run_id, version=adapter.version,
                                               manifest_sha256=adapter.manifest_sha256, load_ms=load_ms)

    @_status_on_error
    async def ListAdapters(self, request: rollout_pb2.ListAdaptersRequest,
                           context: grpc.aio.ServicerContext) -> rollout_pb2.ListAdaptersResponse:
        ready = self._get_ready()
        return rollout_pb2.ListAdaptersResponse(adapters=[
            rollout_pb2.LoadedAdapter(run_id=a.run_id, version=a.version, path=str(a.source),
                                      manifest_sha256=a.manifest_sha256)
            for a in ready.adapters.loaded()
        ])

    @_status_on_error
    async def ReleaseAdapters(self, request: rollout_pb2.ReleaseAdaptersRequest,
                              context: grpc.aio.ServicerContext) -> rollout_pb2.ReleaseAdaptersResponse:
        ready = self._get_ready()
        return rollout_pb2.ReleaseAdaptersResponse(released=await ready.adapters.release_run(request.run_id))

    @_status_on_error
    async def Sleep(self, request: rollout_pb2.SleepRequest,
                    context: grpc.aio.ServicerContext) -> rollout_pb2.SleepResponse:
        ready = self._get_ready()
        if request.level not in (0, 1):
            raise InvalidArgument(f"sleep level must be 1 (0 means 1), got {request.level}: level 2 discards the "
                                  "weights and WakeUp does not reload them")
        if not ready.engine.info.sleep_supported:  # refused before any Generate call is held up
            raise FailedPrecondition("this engine has no sleep mode (vLLM's sleep mode needs a GPU)")
        async with self._sleep_lock:
            if self._asleep:  # again while asleep: nothing to do
                return rollout_pb2.SleepResponse()
            self._sleep_pending = True
            try:
                async with self._generate_done:
                    await self._generate_done.wait_for(lambda: self._generating == 0)
                if _gave_up(context):  # the caller left while it waited: the engine stays awake
                    raise DeadlineExceeded(
                        "the caller left (cancelled or past its deadline) while Generate calls ran; still awake"
                    )
                # From here a failure or a cancellation leaves the engine possibly asleep: it stays marked
                # asleep, and WakeUp wakes it (waking an engine that is awake does nothing).
                self._asleep = True
                try:
                    await ready.engine.sleep(1)
                except RolloutError:  # refused: nothing changed
                    self._asleep = False
                    raise
            finally:
                self._sleep_pending = False
        return rollout_pb2.SleepResponse()

    @_status_on_error
    async def WakeUp(self, request: rollout_pb2.WakeUpRequest,
                     context: grpc.aio.ServicerContext) -> rollout_pb2.WakeUpResponse:
        ready = self._get_ready()
        async with self._sleep_lock:  # after a Sleep in progress
            if self._asleep:  # awake already (a coordinator wakes the engines when a run restarts): nothing to do
                await ready.engine.wake_up()
                self._asleep = False
        return rollout_pb2.WakeUpResponse()

    @_status_on_error
    async def GetModelInfo(self, request: rollout_pb2.GetModelInfoRequest,
                           context: grpc.aio.ServicerContext) -> rollout_pb2.GetModelInfoResponse:
        info = self._get_ready().engine.info
        return rollout_pb2.GetModelInfoResponse(model=info.name, max_model_len=info.max_model_len,
                                                vocab_size=info.vocab_size, sleep_supported=info.sleep_supported,
                                                max_adapter_runs=self.config.max_adapter_runs)


def _gave_up(context: grpc.aio.ServicerContext) -> bool:
    """Whether the caller cancelled the call or its deadline has passed (the server may not have
    cancelled the handler yet: a Generate ending can wake it first)."""
    remaining = context.time_remaining()
    return context.cancelled() or (remaining is not None and remaining <= 0)


def _fill_result(out: rollout_pb2.GenerationResult, result: EngineResult, adapter_version: int) -> None:
    out.prompt_token_ids.extend(result.prompt_token_ids)
    out.adapter_version = adapter_version
    out.num_cached_tokens = result.num_cached_tokens
    for completion in result.completions:
        c = out.completions.add()
        c.token_ids.extend(completion.token_ids)
        c.logprobs.extend(completion.logprobs)
        c.text = completion.text
        c.finish_reason = completion.finish_reason


async def monitor_health(engine: Engine, set_serving: Callable[[bool], Awaitable[None]], interval_s: float,
                         timeout_s: float, serving: bool | None = None) -> None:
    """Probes the engine every `interval_s` and reports SERVING/NOT_SERVING on every change
    (`serving`: the state already reported)."""
    while True:
        try:
            await asyncio.wait_for(engine.check_health(), timeout_s)
            healthy = True
        except Exception as exc:  # dead engine, timeout, broken pipe: all mean "not serving"
            healthy = False
            if serving is not False:
                log.error("engine health probe failed", extra={"error": repr(exc)})
        if healthy != serving:
            await set_serving(healthy)
            serving = healthy
            log.info("health changed", extra={"serving": healthy})
        await asyncio.sleep(interval_s)


EngineFactory = Callable[[RolloutConfig], Awaitable[Engine]]


class RolloutServer:
    """A started server whose engine comes up in the background (what `mmrl serve rollout` runs)."""

    def __init__(self, running: RunningServer, servicer: RolloutServicer, registry_args: dict[str, Any]) -> None:
        self.running = running
        self.servicer = servicer
        self._registry_args = registry_args
        self.engine: Engine | None = None
        self.adapters: AdapterRegistry | None = None
        self._monitor: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return self.running.port

    @classmethod
    async def start(cls, config: RolloutConfig, address: str, **registry_args: Any) -> RolloutServer:
        """Listens at `address` (NOT_SERVING); `registry_args`: shared_root and cache_dir."""
        servicer = RolloutServicer(config)
        running = await start_server(
            lambda server: rollout_pb2_grpc.add_RolloutServiceServicer_to_server(servicer, server),
            SERVICE_NAME, address, serving=False,
        )
        return cls(running, servicer, registry_args)

    async def start_engine(self, factory: EngineFactory) -> None:
        """Starts the engine, attaches it and turns health to SERVING via the health monitor."""
        config = self.servicer.config
        start = time.perf_counter()
        self.engine = await factory(config)
        probe = ProbePolicy(config.adapter_probe, config.resolved_probe_tolerance(self.engine.info.dtype),
                            replica=f"{socket.gethostname()}:{self.port}")
        self.adapters = AdapterRegistry(self.engine, retention=config.adapter_retention,
                                        max_runs=config.max_adapter_runs, max_rank=config.max_lora_rank,
                                        probe=probe, tower_lora=config.tower_lora, **self._registry_args)
        self.servicer.attach(self.engine, self.adapters)
        log.info("engine ready", extra={"startup_s": round(time.perf_counter() - start, 1),
                                        "model": self.engine.info.name})
        await asyncio.wait_for(self.engine.check_health(), config.health_timeout_s)
        await self.running.set_serving(True)
        self._monitor = asyncio.create_task(monitor_health(
            self.engine, self.running.set_serving, config.health_interval_s, config.health_timeout_s,
            serving=True))

    async def close(self) -> None:
        """Stops probing, shuts the engine down and removes the local adapter copies."""
        if self._monitor is not None:
            self._monitor.cancel()
        await self.running.set_serving(False)
        self.servicer.detach()
        engine, adapters, self.engine, self.adapters = self.engine, self.adapters, None, None
        if engine is not None:
            await engine.shutdown()
        if adapters is not None:
            await adapters.close()
