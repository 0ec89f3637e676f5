"""A real env gRPC service on loopback for the SFT tests (the maze, or another environment)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def with_env_service(work: Callable[[str], T], env: Any = None) -> T:
    """Runs `work(address)` in a thread while a real env gRPC service (`env`, default a MazeEnv)
    listens on loopback."""
    from mmrl_proto.v1 import env_pb2_grpc
    from services.common.grpc_server import start_server
    from services.env.config import EnvConfig
    from services.env.maze.env import MazeEnv
    from services.env.servicer import SERVICE_NAME, EnvServicer

    async def serve() -> T:
        servicer = EnvServicer(env if env is not None else MazeEnv(EnvConfig()))
        running = await start_server(lambda s: env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, s),
                                     SERVICE_NAME, "127.0.0.1:0")
        try:
            return await asyncio.to_thread(work, f"127.0.0.1:{running.port}")
        finally:
            await running.stop()

    return asyncio.run(serve())
