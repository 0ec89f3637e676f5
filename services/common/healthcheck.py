"""`python -m services.common.healthcheck HOST:PORT [SERVICE]`: exit 0 when a gRPC server is SERVING.

Used by container health checks (no grpc_health_probe binary needed).
"""

from __future__ import annotations

import asyncio
import sys

from services.common.grpc_server import check_health


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print("usage: python -m services.common.healthcheck HOST:PORT [SERVICE]", file=sys.stderr)
        return 2
    ok = asyncio.run(check_health(argv[0], argv[1] if len(argv) > 1 else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
