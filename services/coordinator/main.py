"""`mmrl serve coordinator`: the REST API and the run loops, state in Redis."""

from __future__ import annotations

import argparse
import os


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl serve coordinator", description=__doc__)
    parser.add_argument("--host", default=os.environ.get("MMRL_COORDINATOR_HOST", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("MMRL_COORDINATOR_PORT", "8000")))
    parser.add_argument("--log-level", default=os.environ.get("MMRL_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)

    import uvicorn

    from services.common import tracing
    from services.common.logging import setup_logging
    from services.coordinator.api.app import create_app
    from services.coordinator.config import CoordinatorSettings

    setup_logging("coordinator", args.log_level)
    settings = CoordinatorSettings()  # MMRL_* environment variables
    tracing.configure("coordinator", settings.tracing)
    app = create_app(settings)
    # uvicorn handles SIGTERM/SIGINT gracefully; run loops are cancelled and resume on restart.
    uvicorn.run(app, host=args.host, port=args.port, log_config=None, access_log=False)
    return 0
