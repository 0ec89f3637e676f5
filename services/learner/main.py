"""`mmrl serve learner --model DIR [--port P] [--shared-root DIR] [--nproc N] [--nnodes N
--node-rank R --rdzv-endpoint H:P --rdzv-id ID]`: serve the GRPO learner over gRPC.

With several ranks the command re-executes itself under torchrun (`python -m
torch.distributed.run`); rank 0 serves gRPC and drives the others, which wait for its commands.
Settings come from MMRL_LEARNER_* / MMRL_SHARED_ROOT environment variables; flags override them.
Stops gracefully on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from services.common.logging import setup_logging
from services.common.messages import summary
from services.learner.config import LearnerSettings


def parser(settings: LearnerSettings) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmrl serve learner", description=summary(__doc__))
    parser.add_argument("--model", type=Path, default=settings.model, help="HF model directory")
    parser.add_argument("--shared-root", type=Path, default=settings.shared_root, help="shared storage root")
    parser.add_argument("--host", default=settings.host, help=f"address rank 0 listens on ({settings.host})")
    parser.add_argument("--port", type=int, default=settings.port, help="gRPC port, 0 = any free")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once serving")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default=settings.device)
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default=settings.dtype)
    parser.add_argument(
        "--num-threads", type=int, default=settings.num_threads, help="torch CPU threads per rank"
    )
    parser.add_argument(
        "--image-cache-mb", type=int, default=settings.image_cache_mb,
        help="memory for the frozen vision tower's outputs per frame (0: off)",
    )
    parser.add_argument(
        "--replicate-base", action=argparse.BooleanOptionalAction, default=settings.replicate_base,
        help="keep the whole frozen base on every rank (shard only the adapter)",
    )
    parser.add_argument("--log-level", default=settings.log_level)
    parser.add_argument("--nproc", type=int, default=1, help="ranks on this node (torchrun when > 1)")
    parser.add_argument("--nnodes", type=int, default=1, help="nodes (torchrun rendezvous when > 1)")
    parser.add_argument("--node-rank", type=int, help="this node's rank (static rendezvous; rank 0 serves)")
    parser.add_argument("--rdzv-endpoint", help="HOST:PORT of the rendezvous (multi-node)")
    parser.add_argument("--rdzv-id", default="mmrl-learner", help="rendezvous id (multi-node)")
    return parser


def worker_argv(args: argparse.Namespace) -> list[str]:
    """The flags every rank needs (the launcher's own flags are left out: torchrun would try to
    read an abbreviation like --nproc as one of its options)."""
    argv = [
        f"--model={args.model}",
        f"--shared-root={args.shared_root}",
        f"--host={args.host}",
        f"--port={args.port}",
        f"--device={args.device}",
        f"--dtype={args.dtype}",
        f"--log-level={args.log_level}",
        f"--image-cache-mb={args.image_cache_mb}",
        "--replicate-base" if args.replicate_base else "--no-replicate-base",
    ]
    if args.num_threads is not None:
        argv.append(f"--num-threads={args.num_threads}")
    if args.port_file is not None:
        argv.append(f"--port-file={args.port_file}")
    return argv


def torchrun_command(args: argparse.Namespace) -> list[str]:
    """`python -m torch.distributed.run ... -m services.learner.main <worker flags>`."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.nproc}"]
    if args.nnodes > 1:
        if not args.rdzv_endpoint:
            raise SystemExit("--nnodes > 1 needs --rdzv-endpoint HOST:PORT")
        command += [f"--nnodes={args.nnodes}", f"--rdzv-id={args.rdzv_id}"]
        if args.node_rank is not None:
            host, port = args.rdzv_endpoint.rsplit(":", 1)
            command += [f"--node-rank={args.node_rank}", f"--master-addr={host}", f"--master-port={port}"]
        else:
            command += ["--rdzv-backend=c10d", f"--rdzv-endpoint={args.rdzv_endpoint}"]
    else:
        command += ["--standalone"]
    return [*command, "-m", "services.learner.main", *worker_argv(args)]


async def _serve(settings: LearnerSettings, engine: object, port_file: Path | None) -> None:
    from mmrl.v1 import learner_pb2_grpc
    from services.common.grpc_server import start_server, wait_for_termination
    from services.learner.driver import LearnerDriver
    from services.learner.servicer import SERVICE_NAME, LearnerServicer

    servicer = LearnerServicer(LearnerDriver(engine))  # type: ignore[arg-type]
    running = await start_server(
        lambda server: learner_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, server),
        SERVICE_NAME,
        f"{settings.host}:{settings.port}",
    )
    if port_file is not None:
        port_file.write_text(str(running.port))
    await wait_for_termination(running, on_stop=[servicer.close])


def main(argv: list[str]) -> int:
    env_settings = LearnerSettings()
    args = parser(env_settings).parse_args(argv)
    if not (Path(args.model) / "config.json").is_file():  # before torchrun: one line, not one per rank
        setup_logging("learner", args.log_level).error(
            "model is not a local checkpoint directory (no config.json); the learner loads weights from a "
            "directory, not from a hub id", extra={"model": str(args.model)})
        return 1
    if (args.nproc > 1 or args.nnodes > 1) and "LOCAL_RANK" not in os.environ:
        command = torchrun_command(args)
        os.execv(command[0], command)
    settings = env_settings.model_copy(
        update={
            "model": args.model,
            "shared_root": args.shared_root,
            "host": args.host,
            "port": args.port,
            "device": args.device,
            "dtype": args.dtype,
            "log_level": args.log_level,
            "num_threads": args.num_threads,
            "image_cache_mb": args.image_cache_mb,
            "replicate_base": args.replicate_base,
        }
    )
    log = setup_logging("learner", settings.log_level)

    from services.learner.distributed import init_distributed
    from services.learner.driver import worker_loop
    from services.learner.engine import LearnerEngine

    ctx = init_distributed(settings.device)
    if ctx.device.type == "cpu":  # host memory holds the weights: freed gathers go back to the system
        from services.learner.memory import return_large_frees_to_the_system

        return_large_frees_to_the_system()
    log.info(
        "starting learner rank",
        extra={
            "rank": ctx.rank,
            "world_size": ctx.world_size,
            "device": str(ctx.device),
            "settings": settings.model_dump(mode="json"),
        },
    )
    engine = LearnerEngine(settings, ctx)
    if ctx.is_main:
        asyncio.run(_serve(settings, engine, args.port_file))
    else:
        worker_loop(engine)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
