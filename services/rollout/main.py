"""`mmrl serve rollout`: serve vLLM generation over gRPC.

Every option is also an environment variable (`config.ServerSettings`: MMRL_ROLLOUT_*,
MMRL_SHARED_ROOT); flags override them. The engine's settings come from a YAML or TOML file
(`--config`, `config.RolloutConfig`), and each of them can be given as a flag too, which overrides
the file. The server listens at once with health NOT_SERVING, starts the engine, then reports
SERVING. SIGTERM/SIGINT stop the server and shut the engine down.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
from pathlib import Path

from services.common.config_files import load_model_file
from services.common.grpc_server import wait_for_termination
from services.common.logging import setup_logging
from services.common.messages import summary
from services.common.observability import start_observability
from services.common.settings_cli import add_model_options, given_values, settings_from
from services.rollout.config import RolloutConfig, ServerSettings
from services.rollout.service import RolloutServer

log = logging.getLogger("mmrl.rollout")


async def serve(config: RolloutConfig, address: str, shared_root: Path, cache_dir: Path) -> int:
    """Runs the service until SIGTERM/SIGINT; 1 if the engine failed to start."""
    from services.rollout.engine_vllm import VllmEngine

    server = await RolloutServer.start(config, address, shared_root=shared_root, cache_dir=cache_dir)

    async def start_engine() -> None:
        try:
            await server.start_engine(VllmEngine.start)
        except Exception:
            log.exception("engine failed to start")
            await server.running.stop(grace_s=0)  # ends wait_for_termination below
            raise

    starting = asyncio.create_task(start_engine())

    async def stop_engine() -> None:
        await asyncio.wait([starting])  # an engine still starting (in a thread) cannot be interrupted
        await server.close()

    await wait_for_termination(server.running, on_stop=[stop_engine])
    return 1 if starting.exception() is not None else 0


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmrl serve rollout", description=summary(__doc__))
    add_model_options(parser, ServerSettings, renamed={"config_file": ["--config"]})
    engine = parser.add_argument_group("engine (RolloutConfig: the --config file's settings)")
    add_model_options(engine, RolloutConfig, dest_prefix="config.", skip=ServerSettings.model_fields)
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    settings = settings_from(ServerSettings, given_values(args, ServerSettings))
    overrides = given_values(args, RolloutConfig, "config.") | ({"model": settings.model} if settings.model else {})
    config = load_model_file(RolloutConfig, settings.config_file, overrides)
    setup_logging("rollout", settings.log_level)
    log.info("starting rollout service", extra={"config": config.model_dump(), "shared_root": str(settings.shared_root)})
    start_observability("rollout", settings.metrics_port, settings.tracing, settings.host)
    with tempfile.TemporaryDirectory(prefix="mmrl-rollout-adapters-") as tmp:
        cache_dir = settings.adapter_cache_dir or Path(tmp)
        cache_dir.mkdir(parents=True, exist_ok=True)
        return asyncio.run(serve(config, f"{settings.host}:{settings.port}", settings.shared_root, cache_dir))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
