"""`mmrl serve openenv`: an MMRL environment served as an OpenEnv environment (openenv-core's HTTP and
WebSocket server: /reset, /step, /state, /ws, /health), for trainers that speak OpenEnv.

`--env NAME` a registered environment (maze, sokoban) or `--gymnasium ID` a Gymnasium one, as for
`mmrl serve env`; each OpenEnv session plays one episode of its own (services/env/openenv/served.py).
"""

from __future__ import annotations

import argparse
import sys

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.common.logging import setup_logging
from services.common.messages import summary
from services.common.settings_cli import add_model_options, given_values, settings_from
from services.env.config import EnvConfig, ServerSettings
from services.env.main import environment


class OpenEnvSettings(BaseSettings):
    """Deployment settings of `mmrl serve openenv`, from MMRL_OPENENV_* environment variables."""

    model_config = SettingsConfigDict(env_prefix="MMRL_OPENENV_", extra="forbid", use_attribute_docstrings=True)

    env: str = Field(default="maze", min_length=1, max_length=100)
    """The registered environment served (MMRL_OPENENV_ENV)."""
    gymnasium: str = Field(default="", max_length=200)
    """A Gymnasium preset or id served instead of `env` (MMRL_OPENENV_GYMNASIUM)."""
    host: str = "0.0.0.0"
    """Address to listen on (MMRL_OPENENV_HOST)."""
    port: int = Field(default=8010, ge=0, le=65535)
    """Port to listen on (MMRL_OPENENV_PORT)."""
    max_sessions: int = Field(default=256, ge=1, le=100_000)
    """Most OpenEnv sessions (episodes) at once (MMRL_OPENENV_MAX_SESSIONS)."""
    log_level: str = "INFO"
    """Logging level (MMRL_OPENENV_LOG_LEVEL)."""


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmrl serve openenv", description=summary(__doc__))
    add_model_options(parser, OpenEnvSettings)
    return parser


def main(argv: list[str]) -> int:
    settings = settings_from(OpenEnvSettings, given_values(parser().parse_args(argv), OpenEnvSettings))
    setup_logging("openenv", settings.log_level)
    import uvicorn

    from services.env.openenv.served import create_app

    chosen = ServerSettings(env=settings.env, gymnasium=settings.gymnasium)
    environment(chosen, EnvConfig())  # refuses an unknown env now, not at the first session

    uvicorn.run(create_app(lambda: environment(chosen, EnvConfig()), settings.max_sessions),
                host=settings.host, port=settings.port, log_level=settings.log_level.lower())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
