"""`mmrl serve coordinator`: the REST API and the run loops, state in Redis."""

from __future__ import annotations

import argparse
import os
import socket


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl serve coordinator", description=__doc__)
    parser.add_argument("--host", default=os.environ.get("MMRL_COORDINATOR_HOST", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("MMRL_COORDINATOR_PORT", "8000")))
    parser.add_argument("--log-level", default=os.environ.get("MMRL_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)

    import uvicorn

    from services.common.logging import setup_logging
    from services.coordinator.api.app import create_app
    from services.coordinator.config import CoordinatorSettings

    setup_logging("coordinator", args.log_level)
    settings = CoordinatorSettings()  # MMRL_* environment variables
    if not settings.instance_id:  # restarted on the same host and port: it takes its run leases back at once
        settings.instance_id = f"{socket.gethostname()}:{args.port}"
    app = create_app(settings)
    # uvicorn handles SIGTERM/SIGINT gracefully; run loops are cancelled and resume on restart.
    uvicorn.run(app, host=args.host, port=args.port, log_config=None, access_log=False)
    return 0
