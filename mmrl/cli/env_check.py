"""`mmrl env check ADDR [--json]`: run the environment contract (docs/environments.md) against a
running env server and report each check by name.

Prints one line per check (name, PASS/FAIL, seconds, detail) as it finishes, then a summary; with
--json, one JSON object as the last line. Exit status 0 when every check passes, 1 when one fails,
2 when no gRPC server answers at ADDR.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re

from mmrl.envcheck.runner import CHECK_NAMES, CheckResult, Unreachable, row, run_checks
from services.common.messages import summary
from services.common.user_errors import UsageError

ADDRESS = re.compile(r"^[\w.\-]+:\d{1,5}$|^\[[0-9a-fA-F:]+\]:\d{1,5}$|^unix:.+$")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmrl env check", description=summary(__doc__))
    parser.add_argument("address", metavar="ADDR", help="host:port of the env server (gRPC, mmrl.v1.EnvService)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--timeout-s", type=float, default=10.0,
                        help="time limit of each check and of each call it makes, in seconds (default 10)")
    parser.add_argument("--only", action="append", choices=CHECK_NAMES, metavar="CHECK",
                        help=f"run only this check (repeatable): one of {', '.join(CHECK_NAMES)}")
    return parser


def check_target(address: str, timeout_s: float) -> None:
    """UsageError unless `address` is host:port (or unix:PATH) and `timeout_s` is positive: the
    arguments `mmrl env check` and `mmrl env chance` share."""
    if not ADDRESS.match(address):
        raise UsageError(f"ADDR {address!r}: expected host:port, e.g. 127.0.0.1:50051")
    if not timeout_s > 0:
        raise UsageError(f"--timeout-s {timeout_s}: must be more than 0")


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    check_target(args.address, args.timeout_s)

    def show(result: CheckResult) -> None:
        print(row(result), flush=True)

    try:
        results = asyncio.run(run_checks(args.address, args.timeout_s, args.only, on_result=show))
    except Unreachable as error:
        raise UsageError(str(error)) from None
    failed = [r.name for r in results if not r.passed]
    print(f"{len(results) - len(failed)} of {len(results)} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    if args.json:
        print(json.dumps({"address": args.address, "passed": not failed, "failed": failed,
                          "checks": [r.as_dict() for r in results]}))
    return 1 if failed else 0
