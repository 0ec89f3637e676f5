"""OpenTelemetry tracing across the services: off by default and free when off.

`configure(service, mode)` turns it on in a process ("otlp": the OTLP/gRPC exporter, configured by
the standard OTEL_EXPORTER_OTLP_* environment variables; "console": spans printed as JSON lines;
"off": nothing). Only then is the SDK imported and are the gRPC interceptors installed; with
tracing off `span()` returns a shared no-op context manager and `traced` adds one global read.

The coordinator opens one trace per GRPO step (`begin_step`), and every gRPC call made in it carries
the W3C `traceparent` in its metadata, so the env, rollout and learner servers' spans join that
trace: one step reads as a tree of sampling turns (Generate, Step), the train step, the publish, the
adapter loads and the eval.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, Literal, ParamSpec, TypeVar

import grpc

from services.common.metrics import Behaviour, split_method, wrap_served_call

log = logging.getLogger("mmrl.tracing")

TracingMode = Literal["off", "otlp", "console"]
P = ParamSpec("P")
T = TypeVar("T")

_tracer: Any = None  # an opentelemetry Tracer once configured
_service = ""
_NO_SPAN = contextlib.nullcontext()
# The open GRPO-step span of the current run task and the token that made it current.
_step: contextvars.ContextVar[tuple[Any, Any] | None] = contextvars.ContextVar("mmrl_step_span", default=None)


def enabled() -> bool:
    return _tracer is not None


def configure(service: str, mode: TracingMode, exporter: Any = None) -> None:
    """Turns tracing on for this process as `service` ("coordinator", "env", ...). `exporter`
    (a SpanExporter, e.g. the SDK's InMemorySpanExporter in tests) overrides `mode`'s."""
    global _tracer, _service
    if mode == "off" and exporter is None:
        return
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        if mode == "otlp" and exporter is None:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError as missing:
        log.error("tracing: mode %r needs OpenTelemetry (pip install 'mmrl[tracing]'): %s; tracing stays off",
                  mode, missing)
        return

    provider = TracerProvider(resource=Resource.create({"service.name": f"mmrl-{service}"}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif mode == "otlp":
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    _tracer = provider.get_tracer("mmrl")
    _service = service
    log.info("tracing on", extra={"service": service, "mode": mode if exporter is None else "custom"})


def shutdown() -> None:
    """Turns tracing off again (tests), flushing nothing further."""
    global _tracer
    _tracer = None


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A span as a child of the current one (a no-op while tracing is off)."""
    if _tracer is None:
        return _NO_SPAN
    return _tracer.start_as_current_span(name, attributes={"mmrl.service": _service, **attributes})


def traced(name: str) -> Callable[[Callable[P, Coroutine[Any, Any, T]]], Callable[P, Coroutine[Any, Any, T]]]:
    """Decorates a coroutine function: each call is a span named `name`."""

    def decorate(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            if _tracer is None:
                return await fn(*args, **kwargs)
            with span(name):
                return await fn(*args, **kwargs)

        return wrapper

    return decorate


def begin_step(run_id: str, step: int) -> None:
    """Ends the current task's step span (if any) and opens the root span of GRPO step `step`, the
    parent of everything the task (and the tasks it starts) does until the next call or `end_step`."""
    if _tracer is None:
        return
    end_step()
    from opentelemetry import context, trace

    step_span = _tracer.start_span("grpo.step", context=context.Context(),  # a new trace
                                   attributes={"mmrl.service": _service, "mmrl.run_id": run_id, "mmrl.step": step})
    token = context.attach(trace.set_span_in_context(step_span))
    _step.set((step_span, token))


def end_step() -> None:
    """Ends the current task's step span (a run that finished, paused or failed)."""
    current = _step.get()
    if current is None:
        return
    from opentelemetry import context

    step_span, token = current
    _step.set(None)
    step_span.end()
    with contextlib.suppress(ValueError):  # attached in another context: nothing to restore
        context.detach(token)


@contextlib.contextmanager
def _server_span(name: str, metadata: Any, attributes: dict[str, Any]) -> Iterator[Any]:
    from opentelemetry import trace
    from opentelemetry.propagate import extract

    carrier = {key: value for key, value in (metadata or ()) if isinstance(value, str)}
    parent = extract(carrier)  # only the caller's context: a missing traceparent starts a new trace
    with _tracer.start_as_current_span(name, context=parent, kind=trace.SpanKind.SERVER,
                                       attributes=attributes) as current:
        yield current


class ServerTracingInterceptor(grpc.aio.ServerInterceptor):
    """Each served call is a SERVER span whose parent comes from the caller's `traceparent`."""

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        metadata = details.invocation_metadata

        def trace_call(service: str, method: str, inner: Behaviour) -> Behaviour:
            attributes = {"mmrl.service": _service, "rpc.system": "grpc", "rpc.service": service,
                          "rpc.method": method}

            async def traced_call(request: Any, context: grpc.aio.ServicerContext) -> Any:
                with _server_span(f"{service}/{method}", metadata, attributes):
                    return await inner(request, context)

            return traced_call

        return await wrap_served_call(continuation, details, trace_call)


class ClientTracingInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """Each call is a CLIENT span; its context travels in the call's metadata."""

    async def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        method_name = details.method.decode() if isinstance(details.method, bytes) else details.method
        service, method = split_method(method_name)
        if _tracer is None or service == "Health":
            return await continuation(details, request)
        from opentelemetry import trace
        from opentelemetry.propagate import inject

        with _tracer.start_as_current_span(f"{service}/{method} call", kind=trace.SpanKind.CLIENT, attributes={
                "mmrl.service": _service, "rpc.system": "grpc", "rpc.service": service, "rpc.method": method}):
            carrier: dict[str, str] = {}
            inject(carrier)
            metadata = grpc.aio.Metadata(*(details.metadata or ()), *carrier.items())
            details = grpc.aio.ClientCallDetails(details.method, details.timeout, metadata, details.credentials,
                                                 details.wait_for_ready)
            call = await continuation(details, request)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await call  # the span covers the whole call; the caller sees the error itself
            return call


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    from services.common.metrics import ServerMetricsInterceptor

    return [ServerMetricsInterceptor(), *([ServerTracingInterceptor()] if enabled() else [])]


def client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    from services.common.metrics import ClientMetricsInterceptor

    return [ClientMetricsInterceptor(), *([ClientTracingInterceptor()] if enabled() else [])]
