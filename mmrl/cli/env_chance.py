"""`mmrl env chance ADDR [--eval-set NAME] [--samples K] [--json]`: the solve rate of a uniform random
policy on an eval set of a running env server, the level a start must beat to be reading its frames
(mmrl/envcheck/chance.py).

Every turn picks one of the env's action words (GetEnvInfo `actions`) uniformly at random; each task is
played K times (default 16). Prints the solve rate over all episodes and the share of tasks at least one
episode solved; with --json, one JSON object as the last line."""

from __future__ import annotations

import argparse
import asyncio
import json

import grpc

from mmrl.cli.env_check import check_target
from mmrl.envcheck.chance import chance_rate
from services.common.messages import summary
from services.common.user_errors import CommandFailed, UsageError


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmrl env chance", description=summary(__doc__))
    parser.add_argument("address", metavar="ADDR", help="host:port of the env server (gRPC, mmrl.v1.EnvService)")
    parser.add_argument("--eval-set", default="", help="an eval set of the env by name (default: its fixed set)")
    parser.add_argument("--samples", type=int, default=16, help="random episodes per task (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random actions (default 0)")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="deadline of each call, in seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    check_target(args.address, args.timeout_s)
    if args.samples < 1:
        raise UsageError(f"--samples {args.samples}: must be at least 1")
    try:
        result = asyncio.run(chance_rate(args.address, args.eval_set, args.samples, args.seed, args.timeout_s))
    except ValueError as error:
        raise UsageError(str(error)) from None
    except grpc.aio.AioRpcError as error:
        if error.code() == grpc.StatusCode.UNAVAILABLE:
            raise UsageError(f"no gRPC server answers at {args.address}") from None
        if error.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND):
            raise UsageError(f"{args.address}: {error.details()}") from None
        raise CommandFailed(f"{args.address}: {error.code().name}: {error.details()}") from None
    print(f"{result.env} {result.eval_set}: a uniform random policy over {', '.join(result.actions)} solves "
          f"{result.solve_rate:.4f} of {result.tasks} tasks x {result.samples} episodes (at least one episode: "
          f"{result.pass_rate:.4f}; {result.mean_turns:.1f} turns on average)", flush=True)
    if args.json:
        print(json.dumps({"address": args.address, **result.as_dict()}))
    return 0
