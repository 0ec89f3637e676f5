"""`mmrl serve env [--host H] [--port P] [--config FILE]`: serve the maze environment over gRPC.

Settings come from MMRL_ENV_* environment variables (`config.ServerSettings`); flags override them.
Stops gracefully on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from mmrl.v1 import env_pb2_grpc
from services.common.grpc_server import start_server, wait_for_termination
from services.common.logging import setup_logging
from services.common.messages import summary
from services.common.metrics import start_observability
from services.env.config import ServerSettings, load_config
from services.env.environment import MazeEnv
from services.env.servicer import SERVICE_NAME, EnvServicer


async def serve(address: str, env: MazeEnv) -> None:
    servicer = EnvServicer(env)
    running = await start_server(
        lambda server: env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, server), SERVICE_NAME, address
    )
    await wait_for_termination(running)


def main(argv: list[str]) -> int:
    settings = ServerSettings()
    parser = argparse.ArgumentParser(prog="mmrl serve env", description=summary(__doc__))
    parser.add_argument("--host", default=settings.host, help=f"address to listen on (default {settings.host})")
    parser.add_argument("--port", type=int, default=settings.port, help=f"port, 0 = any free (default {settings.port})")
    parser.add_argument("--config", type=Path, default=settings.config_file, help="EnvConfig as YAML or TOML")
    parser.add_argument("--log-level", default=settings.log_level)
    parser.add_argument("--metrics-port", type=int, default=settings.metrics_port, help="Prometheus port, 0 = off")
    args = parser.parse_args(argv)

    log = setup_logging("env", args.log_level)
    config = load_config(args.config)
    log.info("starting env service", extra={"config": config.model_dump()})
    start_observability("env", args.metrics_port, settings.tracing, args.host)
    asyncio.run(serve(f"{args.host}:{args.port}", MazeEnv(config)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
