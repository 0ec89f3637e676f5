"""How `mmrl serve learner` starts: the launcher's own options, the torchrun command that runs
several ranks (each re-executes `services.learner.main` with the resolved settings as flags), and
rank 0's gRPC server."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.common.settings_cli import add_model_options, given_values, settings_argv
from services.learner.config import LearnerSettings


class Launch(BaseModel):
    """How many ranks serve, and where they meet: options of the command line only."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    port_file: Path | None = None
    """Write the bound port to this file once serving."""
    nproc: int = Field(default=1, ge=1, le=1024)
    """Ranks on this node (torchrun when > 1)."""
    nnodes: int = Field(default=1, ge=1, le=4096)
    """Nodes (torchrun rendezvous when > 1)."""
    node_rank: int | None = Field(default=None, ge=0)
    """This node's rank (static rendezvous; rank 0 serves); unset: c10d rendezvous at rdzv_endpoint."""
    rdzv_endpoint: str | None = None
    """HOST:PORT of the rendezvous (several nodes)."""
    rdzv_id: str = "mmrl-learner"
    """Rendezvous id (several nodes)."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT")
        return self


def add_launch_options(parser: argparse.ArgumentParser) -> None:
    launch = parser.add_argument_group("launch (several ranks run under torchrun; rank 0 serves gRPC)")
    add_model_options(launch, Launch, dest_prefix="launch.")


def launch_from(args: argparse.Namespace) -> Launch:
    return Launch.model_validate(given_values(args, Launch, "launch."))


def torchrun_command(settings: LearnerSettings, launch: Launch) -> list[str]:
    """`python -m torch.distributed.run ... -m services.learner.main <settings as flags>` (the
    launcher's own flags are left out: torchrun would read an abbreviation like --nproc as its own)."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={launch.nproc}"]
    if launch.nnodes > 1:
        assert launch.rdzv_endpoint is not None  # Launch checks it
        command += [f"--nnodes={launch.nnodes}", f"--rdzv-id={launch.rdzv_id}"]
        if launch.node_rank is not None:
            host, port = launch.rdzv_endpoint.rsplit(":", 1)
            command += [f"--node-rank={launch.node_rank}", f"--master-addr={host}", f"--master-port={port}"]
        else:
            command += ["--rdzv-backend=c10d", f"--rdzv-endpoint={launch.rdzv_endpoint}"]
    else:
        command += ["--standalone"]
    worker = settings_argv(settings) + ([f"--port-file={launch.port_file}"] if launch.port_file is not None else [])
    return [*command, "-m", "services.learner.main", *worker]


async def serve(settings: LearnerSettings, engine: object, port_file: Path | None) -> None:
    """Rank 0: the gRPC server driving every rank, until SIGTERM/SIGINT."""
    from mmrl_proto.v1 import learner_pb2_grpc
    from services.common.grpc_server import start_server, wait_for_termination
    from services.common.observability import start_observability
    from services.learner.driver import LearnerDriver
    from services.learner.servicer import SERVICE_NAME, LearnerServicer

    start_observability("learner", settings.metrics_port, settings.tracing, settings.host)
    servicer = LearnerServicer(LearnerDriver(engine))  # type: ignore[arg-type]
    running = await start_server(
        lambda server: learner_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, server),
        SERVICE_NAME,
        f"{settings.host}:{settings.port}",
    )
    if port_file is not None:
        port_file.write_text(str(running.port))
    await wait_for_termination(running, on_stop=[servicer.close])
