"""The optional gRPC token on a real grpc.aio server on loopback: calls without it are refused,
health checks are not, and channels made with the token configured send it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import pytest

from mmrl_proto.v1 import env_pb2, env_pb2_grpc
from services.common.grpc_auth import TOKEN_ENV
from services.common.grpc_server import (
    CHANNEL_OPTIONS,
    SERVER_OPTIONS,
    channel,
    check_health,
    start_server,
    sync_channel,
)
from services.env.config import EnvConfig
from services.env.maze.env import MazeEnv
from services.env.servicer import SERVICE_NAME, EnvServicer


async def _env_server() -> object:
    servicer = EnvServicer(MazeEnv(EnvConfig()))
    return await start_server(lambda s: env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, s),
                              SERVICE_NAME, "127.0.0.1:0")


async def test_a_server_with_a_token_refuses_calls_without_it_but_answers_health(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "grpc-secret")
    running = await _env_server()
    address = f"127.0.0.1:{running.port}"  # type: ignore[attr-defined]
    try:
        async with grpc.aio.insecure_channel(address) as bare:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await env_pb2_grpc.EnvServiceStub(bare).GetEvalSet(env_pb2.GetEvalSetRequest(), timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert TOKEN_ENV in (refused.value.details() or "")
            wrong = (("authorization", "Bearer nope"),)
            with pytest.raises(grpc.aio.AioRpcError) as refused_wrong:
                await env_pb2_grpc.EnvServiceStub(bare).GetEvalSet(env_pb2.GetEvalSetRequest(), timeout=5,
                                                                   metadata=wrong)
            assert refused_wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert await check_health(address)  # probes need no secret
        async with channel(address) as with_token:  # MMRL_GRPC_TOKEN is set: the channel sends it
            reply = await env_pb2_grpc.EnvServiceStub(with_token).GetEvalSet(env_pb2.GetEvalSetRequest(), timeout=5)
            assert len(reply.specs) > 0
    finally:
        await running.stop(grace_s=0)  # type: ignore[attr-defined]


async def test_without_a_token_nothing_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    running = await _env_server()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as bare:  # type: ignore[attr-defined]
            reply = await env_pb2_grpc.EnvServiceStub(bare).GetEvalSet(env_pb2.GetEvalSetRequest(), timeout=5)
            assert reply.specs
    finally:
        await running.stop(grace_s=0)  # type: ignore[attr-defined]


def test_channels_and_servers_ping_idle_peers_within_seconds() -> None:
    for options in (CHANNEL_OPTIONS, SERVER_OPTIONS):
        settings = dict(options)
        assert settings["grpc.keepalive_time_ms"] <= 30_000
        assert settings["grpc.keepalive_timeout_ms"] <= 10_000
        assert settings["grpc.keepalive_permit_without_calls"] == 1
    # The server accepts the clients' pings (else it answers them with GOAWAY "too_many_pings").
    assert dict(SERVER_OPTIONS)["grpc.http2.min_ping_interval_without_data_ms"] <= dict(CHANNEL_OPTIONS)["grpc.keepalive_time_ms"]


async def test_blocking_channels_send_the_token_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "grpc-secret")
    running = await _env_server()
    address = f"127.0.0.1:{running.port}"  # type: ignore[attr-defined]

    def call(make: Callable[[str], grpc.Channel]) -> int:
        with make(address) as ch:
            return len(env_pb2_grpc.EnvServiceStub(ch).GetEvalSet(env_pb2.GetEvalSetRequest(), timeout=5).specs)

    try:  # blocking calls from a thread: the server runs on this event loop
        assert await asyncio.to_thread(call, sync_channel) > 0  # e.g. the SFT data builder's channel
        with pytest.raises(grpc.RpcError) as refused:
            await asyncio.to_thread(call, grpc.insecure_channel)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    finally:
        await running.stop(grace_s=0)  # type: ignore[attr-defined]
