"""Serving a gRPC servicer the same way in every service.

Every server gets the standard `grpc.health.v1` health service and reflection, listens on the
given address (port 0 picks a free port, for tests) and stops gracefully on SIGTERM/SIGINT.

Keepalive: servers and channels ping an idle connection every KEEPALIVE_TIME_MS and drop it when no
answer comes within KEEPALIVE_TIMEOUT_MS, so a call to a peer whose node vanished ends UNAVAILABLE
within seconds instead of waiting out its deadline. Auth: see services/common/grpc_auth.py.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common import grpc_auth, tracing

log = logging.getLogger("mmrl.grpc")

# Generous message limits: a Generate or TrainStep call carries frames and token arrays of a
# whole batch.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000
_MESSAGE_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
_KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    # gRPC core waits this long for any ping's answer (default 60 s), a keepalive ping's included: without
    # it a vanished peer is noticed after about a minute (tests/test_grpc_keepalive.py).
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),  # a training call may send no data for minutes
]
CHANNEL_OPTIONS = _MESSAGE_OPTIONS + _KEEPALIVE_OPTIONS
SERVER_OPTIONS = _MESSAGE_OPTIONS + _KEEPALIVE_OPTIONS + [
    # Accept the clients' pings (a server answers pings more often than this with GOAWAY).
    ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
]


@dataclass
class RunningServer:
    """A started server, the port it listens on and its health servicer."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    service_name: str

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        await self.health.set(self.service_name, status)
        await self.health.set("", status)

    async def stop(self, grace_s: float = 5.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)


async def start_server(
    add_servicer: Callable[[grpc.aio.Server], None],
    service_full_name: str,
    address: str,
    serving: bool = True,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
) -> RunningServer:
    """Starts a grpc.aio server with health and reflection.

    `add_servicer` registers the service (e.g. `lambda s: add_EnvServiceServicer_to_server(x, s)`),
    `service_full_name` is e.g. "mmrl.v1.EnvService", `address` e.g. "127.0.0.1:0".
    Health starts as SERVING unless `serving` is False (services whose engine loads later).
    `interceptors` run first (metrics, tracing), then the token check when MMRL_GRPC_TOKEN is set.
    """
    server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=[
        *interceptors, *tracing.server_interceptors(), *grpc_auth.server_interceptors()])
    add_servicer(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [service_full_name, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME],
        server,
    )
    port = server.add_insecure_port(address)
    if port == 0:
        raise ValueError(f"cannot listen on {address!r}")
    await server.start()
    running = RunningServer(server, port, health_servicer, service_full_name)
    await running.set_serving(serving)
    log.info("grpc server listening", extra={"service": service_full_name, "port": port})
    return running


async def wait_for_termination(running: RunningServer, on_stop: Sequence[Callable[[], object]] = ()) -> None:
    """Blocks until SIGTERM/SIGINT, then shuts the server down gracefully and runs `on_stop`."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server_done = asyncio.ensure_future(running.server.wait_for_termination())
    stop_wait = asyncio.ensure_future(stop.wait())
    await asyncio.wait([server_done, stop_wait], return_when=asyncio.FIRST_COMPLETED)
    log.info("shutting down", extra={"service": running.service_name})
    await running.stop()
    for callback in on_stop:
        result = callback()
        if asyncio.iscoroutine(result):
            await result
    server_done.cancel()
    stop_wait.cancel()


def channel(target: str) -> grpc.aio.Channel:
    """An insecure aio channel with the servers' message limits and keepalive (calls counted, traced
    when tracing is on), sending the gRPC token when one is configured."""
    return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS, interceptors=[
        *tracing.client_interceptors(), *grpc_auth.client_interceptors()])


def sync_channel(target: str) -> grpc.Channel:
    """The blocking counterpart of `channel` (message limits, keepalive, the gRPC token when one is
    configured), for code outside an event loop such as the SFT data builder."""
    return grpc.intercept_channel(grpc.insecure_channel(target, options=CHANNEL_OPTIONS),
                                  *grpc_auth.sync_client_interceptors())


async def check_health(target: str, service: str = "", timeout_s: float = 2.0) -> bool:
    """True when the server at `target` reports SERVING for `service` ("" = the whole server)."""
    async with channel(target) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def abort_invalid(context: grpc.aio.ServicerContext, message: str) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
