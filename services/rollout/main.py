"""`mmrl serve rollout --model DIR [--port P] [--config FILE]`: serve vLLM generation over gRPC.

Settings come from MMRL_ROLLOUT_* / MMRL_SHARED_ROOT environment variables (`config.ServerSettings`);
flags override them. The server listens at once with health NOT_SERVING, starts the engine, then
reports SERVING. SIGTERM/SIGINT stop the server and shut the engine down.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
from pathlib import Path

from pydantic import ValidationError

from services.common.grpc_server import wait_for_termination
from services.common.logging import setup_logging
from services.common.messages import summary
from services.common.metrics import start_observability
from services.rollout.config import RolloutConfig, ServerSettings, load_config
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


def main(argv: list[str]) -> int:
    settings = ServerSettings()
    parser = argparse.ArgumentParser(prog="mmrl serve rollout", description=summary(__doc__))
    parser.add_argument("--model", default=settings.model, help="model directory (MMRL_ROLLOUT_MODEL)")
    parser.add_argument("--host", default=settings.host, help=f"address to listen on (default {settings.host})")
    parser.add_argument("--port", type=int, default=settings.port, help=f"port, 0 = any free (default {settings.port})")
    parser.add_argument("--config", type=Path, default=settings.config_file, help="RolloutConfig as YAML or TOML")
    parser.add_argument("--shared-root", type=Path, default=settings.shared_root,
                        help=f"shared storage root (MMRL_SHARED_ROOT, default {settings.shared_root})")
    parser.add_argument("--max-model-len", type=int, default=None, help="context length override")
    parser.add_argument("--max-lora-rank", type=int, default=None,
                        help="largest LoRA rank accepted, one of vLLM's sizes (default 16)")
    parser.add_argument("--log-level", default=settings.log_level)
    parser.add_argument("--metrics-port", type=int, default=settings.metrics_port, help="Prometheus port, 0 = off")
    args = parser.parse_args(argv)

    try:
        config = load_config(args.config, {"model": args.model, "max_model_len": args.max_model_len,
                                          "max_lora_rank": args.max_lora_rank})
    except (ValidationError, OSError, ValueError) as exc:
        parser.error(f"invalid configuration: {exc}")
    setup_logging("rollout", args.log_level)
    log.info("starting rollout service", extra={"config": config.model_dump(), "shared_root": str(args.shared_root)})
    start_observability("rollout", args.metrics_port, settings.tracing, args.host)
    with tempfile.TemporaryDirectory(prefix="mmrl-rollout-adapters-") as tmp:
        cache_dir = settings.adapter_cache_dir or Path(tmp)
        cache_dir.mkdir(parents=True, exist_ok=True)
        return asyncio.run(serve(config, f"{args.host}:{args.port}", args.shared_root, cache_dir))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
