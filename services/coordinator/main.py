"""`mmrl serve coordinator`: the REST API and the run loops, state in Redis.

Every option is also an environment variable (`config.CoordinatorSettings`, MMRL_*); flags
override them. Stops gracefully on SIGTERM/SIGINT; runs left running resume on the next start.
"""

from __future__ import annotations

import argparse
import socket

from services.common.messages import summary
from services.common.settings_cli import add_model_options, given_values, settings_from
from services.coordinator.config import CoordinatorSettings


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmrl serve coordinator", description=summary(__doc__))
    add_model_options(parser, CoordinatorSettings)
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    settings = settings_from(CoordinatorSettings, given_values(args, CoordinatorSettings))

    import uvicorn

    from services.common import tracing
    from services.common.logging import setup_logging
    from services.coordinator.api.app import create_app

    setup_logging("coordinator", settings.log_level)
    tracing.configure("coordinator", settings.tracing)
    if not settings.instance_id:  # restarted on the same host and port: it takes its run leases back at once
        settings.instance_id = f"{socket.gethostname()}:{settings.port}"
    app = create_app(settings)
    # uvicorn handles SIGTERM/SIGINT gracefully; run loops are cancelled and resume on restart.
    uvicorn.run(app, host=settings.host, port=settings.port, log_config=None, access_log=False)
    return 0
