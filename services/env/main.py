"""`mmrl serve env`: serve an environment over gRPC (`--env NAME`, one of services/env/registry.py;
the maze by default; or `--gymnasium ID` [--kwargs JSON] [--action-words w1,w2], a Gymnasium env; or
`--openenv URL --action-words w1,w2`, an OpenEnv server's env).

Every option is also an environment variable (`config.ServerSettings`, MMRL_ENV_*); flags override
them. The environment's limits come from a YAML or TOML file (`--config`, `config.EnvConfig`), and
each of them can be given as a flag too, which overrides the file. Stops gracefully on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from mmrl_proto.v1 import env_pb2_grpc
from services.common.config_files import load_model_file
from services.common.grpc_server import start_server, wait_for_termination
from services.common.logging import setup_logging
from services.common.messages import summary
from services.common.observability import start_observability
from services.common.settings_cli import add_model_options, given_values, settings_from
from services.common.user_errors import UsageError
from services.env import registry
from services.env.config import EnvConfig, ServerSettings
from services.env.kit.batched import Environment
from services.env.servicer import SERVICE_NAME, EnvServicer


async def serve(address: str, env: Environment) -> None:
    servicer = EnvServicer(env)
    running = await start_server(
        lambda server: env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, server), SERVICE_NAME, address
    )
    await wait_for_termination(running)


def environment(settings: ServerSettings, config: EnvConfig) -> Environment:
    """The OpenEnv server `settings.openenv` names, the Gymnasium env or preset `settings.gymnasium`
    names, else the registered env `settings.env`."""
    if settings.openenv:
        from services.env.openenv.played import OpenEnvEnv, OpenEnvSource

        words = tuple(w.strip() for w in settings.action_words.split(",") if w.strip())
        try:
            return OpenEnvEnv(OpenEnvSource(settings.openenv, "openenv", words, settings.openenv_action_field), config)
        except ValueError as exc:
            raise UsageError(f"--openenv {settings.openenv}: {exc}") from exc
    if not settings.gymnasium:
        return registry.create(settings.env, config)
    try:
        import gymnasium

        from services.env.gym.env import GymnasiumEnv
        from services.env.gym.presets import resolve

        return GymnasiumEnv(resolve(settings.gymnasium, settings.gymnasium_kwargs, settings.action_words), config)
    except ImportError as exc:
        raise UsageError(f"--gymnasium needs the gym extra (pip install -e '.[gym]'): {exc}") from exc
    except (ValueError, TypeError, gymnasium.error.Error) as exc:
        raise UsageError(f"--gymnasium {settings.gymnasium}: {exc}") from exc


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmrl serve env", description=summary(__doc__))
    add_model_options(parser, ServerSettings, renamed={"config_file": ["--config"], "gymnasium_kwargs": ["--kwargs"]})
    limits = parser.add_argument_group("environment limits (EnvConfig: the --config file's settings)")
    add_model_options(limits, EnvConfig, dest_prefix="config.")
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    settings = settings_from(ServerSettings, given_values(args, ServerSettings))
    config = load_model_file(EnvConfig, settings.config_file, given_values(args, EnvConfig, "config."))
    log = setup_logging("env", settings.log_level)
    log.info("starting env service", extra={"env": settings.env, "config": config.model_dump()})
    env = environment(settings, config)
    start_observability("env", settings.metrics_port, settings.tracing, settings.host)
    asyncio.run(serve(f"{settings.host}:{settings.port}", env))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
