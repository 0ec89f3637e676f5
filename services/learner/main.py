"""`mmrl serve learner`: serve the GRPO learner over gRPC.

Every setting is also an environment variable (`config.LearnerSettings`: MMRL_LEARNER_*,
MMRL_SHARED_ROOT); flags override them. With several ranks (`--nproc`, `--nnodes`) the command
re-executes itself under torchrun (`python -m torch.distributed.run`); rank 0 serves gRPC and
drives the others, which wait for its commands. Stops gracefully on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from services.common.logging import setup_logging
from services.common.messages import summary
from services.common.settings_cli import add_model_options, given_values, settings_from
from services.common.user_errors import UsageError
from services.learner.config import LearnerSettings
from services.learner.launch import add_launch_options, launch_from, serve, torchrun_command


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmrl serve learner", description=summary(__doc__))
    add_model_options(parser, LearnerSettings)
    add_launch_options(parser)
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    settings = settings_from(LearnerSettings, given_values(args, LearnerSettings))
    launch = launch_from(args)
    if not (settings.model / "config.json").is_file():  # before torchrun: one line, not one per rank
        raise UsageError(f"--model {settings.model}: not a local checkpoint directory (no config.json); the "
                         "learner loads weights from a directory, not from a hub id")
    if (launch.nproc > 1 or launch.nnodes > 1) and "LOCAL_RANK" not in os.environ:
        command = torchrun_command(settings, launch)
        os.execv(command[0], command)
    log = setup_logging("learner", settings.log_level)

    from services.learner.distributed import init_distributed
    from services.learner.driver import worker_loop
    from services.learner.engine import LearnerEngine

    ctx = init_distributed(settings.device)
    if ctx.device.type == "cpu" and (ctx.world_size > 1 or settings.dtype == "bfloat16"):
        # host memory holds sharded weights: FSDP's freed gathers go back to the system (the
        # single float32 rank, which loads the whole model anyway, keeps glibc's defaults)
        from services.learner.memory import return_large_frees_to_the_system

        return_large_frees_to_the_system()
    log.info("starting learner rank", extra={"rank": ctx.rank, "world_size": ctx.world_size, "device": str(ctx.device),
                                             "settings": settings.model_dump(mode="json")})
    engine = LearnerEngine(settings, ctx)
    if ctx.is_main:
        asyncio.run(serve(settings, engine, launch.port_file))
    else:
        worker_loop(engine)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
