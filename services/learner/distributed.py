"""Ranks: process group, FSDP2 sharding, the rank-0 command channel and sharding of a batch.

Every learner process joins a process group, also a lone one (a world of one in-process store),
so that state-dict gathering and commands take one code path; the model is wrapped with FSDP2
`fully_shard` whenever there is more than one rank (or mixed precision to apply).
Training collectives run on the default group (gloo on CPU, NCCL on GPU); commands from rank 0
travel on a separate gloo group with a long timeout, because the other ranks wait there, idle,
between gRPC calls.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# Idle ranks block in the command broadcast until rank 0 gets its next call.
COMMAND_TIMEOUT = timedelta(days=30)
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


@dataclass(frozen=True)
class DistContext:
    """This process's place among the learner ranks."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    control_group: Any  # gloo group for commands and Python objects

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_CONTEXT: DistContext | None = None


def init_distributed(device: str = "auto") -> DistContext:
    """Joins the process group described by torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR/PORT), or makes a world of one when there is none. Idempotent per process."""
    global _CONTEXT
    if _CONTEXT is not None:
        return _CONTEXT
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch_device = torch.device("cuda", local_rank)
        torch.cuda.set_device(torch_device)
    else:
        torch_device = torch.device("cpu")
    backend = "nccl" if use_cuda else "gloo"
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
        else:
            assert world_size == 1, "several ranks need torchrun's MASTER_ADDR/MASTER_PORT"
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    control = dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)
    _CONTEXT = DistContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        device=torch_device,
        control_group=control,
    )
    return _CONTEXT


def is_sharded(ctx: DistContext, compute_dtype: torch.dtype) -> bool:
    """Whether `shard_model` wraps the model with FSDP2 (more than one rank, or mixed precision)."""
    return ctx.world_size > 1 or compute_dtype != torch.float32


def shard_model(model: Any, ctx: DistContext, compute_dtype: torch.dtype, replicate_base: bool = False) -> Any:
    """FSDP2: `fully_shard` every transformer block (the model's `_no_split_modules`: decoder
    layers and vision blocks), then the root. With a compute dtype below float32, parameters are
    gathered in that dtype and gradients reduced in float32. With `replicate_base`, the frozen
    parameters are left out of FSDP (every rank keeps all of them, nothing to gather) and only the
    trainable ones are sharded.

    A single float32 rank has nothing to shard: the model is only moved to the device (FSDP2's
    gather copies would double the step time on CPU). Parameters on the meta device stay there
    (weights.build_policy allocates and fills them after sharding).
    """
    if not is_sharded(ctx, compute_dtype):
        return model.to(ctx.device)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    policy = MixedPrecisionPolicy()
    if compute_dtype != torch.float32:
        policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    ignored = {p for p in model.parameters() if not p.requires_grad} if replicate_base else None
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    block_classes = set(getattr(inner, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in block_classes]
    assert blocks, f"found no transformer blocks among {sorted(block_classes)}"
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, ignored_params=ignored)
    fully_shard(model, mesh=mesh, mp_policy=policy, ignored_params=ignored)
    return model


def broadcast_object(obj: Any, ctx: DistContext) -> Any:
    """Rank 0's `obj` on every rank (others pass None)."""
    holder = [obj]
    if ctx.world_size > 1:
        dist.broadcast_object_list(holder, src=0, group=ctx.control_group)
    return holder[0]


def scatter_objects(per_rank: Sequence[Any] | None, ctx: DistContext) -> Any:
    """Rank r receives `per_rank[r]` from rank 0 (others pass None)."""
    if ctx.world_size == 1:
        assert per_rank is not None
        return per_rank[0]
    out: list[Any] = [None]
    sent = list(per_rank) if ctx.is_main and per_rank is not None else None
    dist.scatter_object_list(out, sent, src=0, group=ctx.control_group)
    return out[0]


def gather_objects(obj: Any, ctx: DistContext) -> list[Any] | None:
    """Every rank's `obj` as a list on rank 0 (None elsewhere)."""
    if ctx.world_size == 1:
        return [obj]
    out: list[Any] | None = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(obj, out, dst=0, group=ctx.control_group)
    return out


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce on the default group ("sum" or "max"); a no-op on one rank."""
    if dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return tensor


def plan_shards(lengths: Sequence[int], world_size: int) -> list[list[tuple[int, bool]]]:
    """Assigns trajectories to ranks: longest first, dealt round-robin, so every rank gets a
    similar token count and similar lengths share micro-batches. Ranks that come up one short
    (or empty, for a batch smaller than the world) get a padding copy of the shortest trajectory,
    so every rank runs the same number of micro-batches (FSDP collectives must match).

    Returns per rank a list of (index into `lengths`, is_padding).
    """
    assert lengths, "no trajectories to shard"
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    shards: list[list[tuple[int, bool]]] = [
        [(i, False) for i in order[r::world_size]] for r in range(world_size)
    ]
    per_rank = max(len(shard) for shard in shards)
    for shard in shards:
        shard.extend((order[-1], True) for _ in range(per_rank - len(shard)))
    return shards
