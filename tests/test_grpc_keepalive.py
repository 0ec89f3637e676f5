"""A peer that vanishes mid-call (a node lost: no FIN, no RST, packets simply stop) is noticed by the
channel's keepalive within seconds, not at the call's deadline. The vanished node is a TCP proxy on
loopback that stops forwarding in both directions while keeping its sockets open."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from mmrl_proto.v1 import env_pb2, env_pb2_grpc
from services.common.grpc_server import KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS, channel, start_server
from services.env.config import EnvConfig
from services.env.maze.env import MazeEnv
from services.env.servicer import SERVICE_NAME, EnvServicer

pytestmark = pytest.mark.slow


class _HangingEnv(EnvServicer):
    """GetEvalSet never answers: a call stays in flight until the channel gives up on the peer."""

    async def GetEvalSet(self, request: env_pb2.GetEvalSetRequest,  # type: ignore[override]
                         context: grpc.aio.ServicerContext) -> env_pb2.GetEvalSetResponse:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


class _Proxy:
    """Forwards TCP between clients and `upstream` until `vanish()`; after it, nothing moves and nothing closes."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.vanished = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    def vanish(self) -> None:
        self.vanished.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True)
        except asyncio.CancelledError:  # the test's loop ends while the vanished node still "holds" the sockets
            pass

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(65536)
            if self.vanished.is_set():
                await asyncio.sleep(3600)  # hold the sockets open and drop everything: a lost node
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()


async def test_a_call_to_a_vanished_peer_fails_within_the_keepalive_window_not_at_its_deadline() -> None:
    running = await start_server(
        lambda s: env_pb2_grpc.add_EnvServiceServicer_to_server(_HangingEnv(MazeEnv(EnvConfig())), s),
        SERVICE_NAME, "127.0.0.1:0")
    proxy = _Proxy(running.port)
    port = await proxy.start()
    try:
        async with channel(f"127.0.0.1:{port}") as ch:
            call = asyncio.ensure_future(env_pb2_grpc.EnvServiceStub(ch).GetEvalSet(
                env_pb2.GetEvalSetRequest(), timeout=300))
            await asyncio.sleep(1.0)  # the call is in flight at the server
            assert not call.done()
            proxy.vanish()
            started = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await call
            waited = time.monotonic() - started
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value
        window_s = (KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS) / 1000
        assert waited <= window_s + 5, f"noticed after {waited:.1f} s; keepalive window {window_s:.0f} s"
    finally:
        assert proxy.server is not None
        proxy.server.close()
        await running.stop(grace_s=0)
