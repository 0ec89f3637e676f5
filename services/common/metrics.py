"""Prometheus metrics of a service process: the `/metrics` HTTP server and the gRPC call metrics.

Every metric lives in prometheus_client's default registry (vLLM's own `vllm:*` metrics of the
rollout service land there too), so one server per process exports everything. Names are
`mmrl_<service>_<what>_<unit>`; docs/observability.md lists them all. Recording a metric costs a
microsecond or so whether or not anything scrapes it; the server runs only when a port is set.

The gRPC interceptors (installed by `services.common.grpc_server` on every server and channel)
count calls by service, method and status code and time them, on both ends:
`mmrl_grpc_server_*` in the called service, `mmrl_grpc_client_*` in the caller (the coordinator's
"service errors" are its client calls whose code is not OK).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import REGISTRY, Counter, Histogram, start_http_server

log = logging.getLogger("mmrl.metrics")

# Seconds, from a cached env step to a long train step or adapter load.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0, 600.0, 1800.0)

GRPC_SERVER_CALLS = Counter("mmrl_grpc_server_calls", "gRPC calls served, by service, method and status code",
                            ["service", "method", "code"])
GRPC_SERVER_SECONDS = Histogram("mmrl_grpc_server_seconds", "Time to serve one gRPC call",
                                ["service", "method"], buckets=LATENCY_BUCKETS)
GRPC_CLIENT_CALLS = Counter("mmrl_grpc_client_calls", "gRPC calls made, by service, method and status code "
                            "(UNAVAILABLE, DEADLINE_EXCEEDED, ... are service errors)",
                            ["service", "method", "code"])
GRPC_CLIENT_SECONDS = Histogram("mmrl_grpc_client_seconds", "Time one gRPC call took, seen by the caller",
                                ["service", "method"], buckets=LATENCY_BUCKETS)

_servers: dict[int, Any] = {}
_lock = threading.Lock()


def serve_metrics(port: int, host: str = "0.0.0.0") -> int | None:
    """Serves the default registry as Prometheus text on http://host:port/metrics from a daemon
    thread; `port` 0 means off (returns None). Returns the port."""
    if port == 0:
        return None
    with _lock:
        if port not in _servers:
            server, _thread = start_http_server(port, addr=host)
            _servers[port] = server
    log.info("serving Prometheus metrics", extra={"port": port, "path": "/metrics"})
    return port


def split_method(full_method: str) -> tuple[str, str]:
    """'/mmrl.v1.EnvService/Step' -> ('EnvService', 'Step')."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service.rpartition(".")[2], method


def _code_of(exc: BaseException, context: Any = None) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return str(exc.code().name)
    if context is not None:
        code = context.code()
        if code is not None:
            return str(code.name) if isinstance(code, grpc.StatusCode) else str(code)
    return "UNKNOWN"


Behaviour = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


async def wrap_served_call(continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                           details: grpc.HandlerCallDetails,
                           wrap: Callable[[str, str, Behaviour], Behaviour]) -> Any:
    """A server interceptor's handler: a unary-unary call of an MMRL service with its behaviour
    wrapped by `wrap(service, method, inner)`; health, reflection and other handlers as they are."""
    handler = await continuation(details)
    if handler is None or handler.unary_unary is None:
        return handler
    service, method = split_method(details.method)
    if service in ("Health", "ServerReflection"):
        return handler
    return grpc.unary_unary_rpc_method_handler(wrap(service, method, handler.unary_unary),
                                               request_deserializer=handler.request_deserializer,
                                               response_serializer=handler.response_serializer)


class ServerMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts and times every unary-unary call a server answers."""

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        def observe(service: str, method: str, inner: Behaviour) -> Behaviour:
            async def observed(request: Any, context: grpc.aio.ServicerContext) -> Any:
                start = time.perf_counter()
                code = "OK"
                try:
                    return await inner(request, context)
                except BaseException as exc:
                    code = _code_of(exc, context)
                    raise
                finally:
                    GRPC_SERVER_SECONDS.labels(service, method).observe(time.perf_counter() - start)
                    GRPC_SERVER_CALLS.labels(service, method, code).inc()

            return observed

        return await wrap_served_call(continuation, details, observe)


class ClientMetricsInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """Counts and times every unary-unary call made on a channel."""

    async def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        method_name = details.method.decode() if isinstance(details.method, bytes) else details.method
        service, method = split_method(method_name)
        start = time.perf_counter()
        call = await continuation(details, request)
        try:
            await call
            code = "OK"
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
        except BaseException:  # cancelled by the caller
            code = "CANCELLED"
            raise
        finally:
            if service != "Health":
                GRPC_CLIENT_SECONDS.labels(service, method).observe(time.perf_counter() - start)
                GRPC_CLIENT_CALLS.labels(service, method, code).inc()
        return call


def exported_names() -> set[str]:
    """Every sample name the default registry exports now (a histogram's _bucket/_sum/_count, a
    counter's _total): what a dashboard query may name."""
    names: set[str] = set()
    for collector in list(REGISTRY._collector_to_names):  # noqa: SLF001 - the registry's own index
        names.update(REGISTRY._collector_to_names[collector])  # noqa: SLF001
    return names
