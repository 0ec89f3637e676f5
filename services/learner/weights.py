"""The policy built without a full copy of the base model on any rank (when it is sharded).

`build_policy` makes the model's skeleton with its parameters on the meta device (buffers, such
as rotary frequencies, computed for real), adds the LoRA adapter on the CPU with exactly the draws
of the unsharded path, shards it (distributed.shard_model), allocates each rank's own part and
then reads into it only that part's rows of every tensor from the checkpoint's safetensors files
(`SafetensorsReader`, plain reads, no memory map). A rank's peak host memory is thus its shard
plus the largest single tensor's shard, not the model. The frozen base is stored in the compute
dtype (bfloat16 on GPU; LoRA weights and the optimiser state stay float32).

The unsharded single float32 rank (the CPU demo) keeps `policy.load_base_model`, whose numbers
the tests and results of record were made with.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from services.learner.distributed import DistContext, shard_model
from services.learner.policy import add_lora, trainable_parameters

SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64}
_PEFT_PREFIX = "base_model.model."


class SafetensorsReader:
    """Reads rows of tensors from a model directory's safetensors file(s) (one file, or an index
    with a weight map) with positioned reads, so only the bytes asked for are ever in memory."""

    def __init__(self, model_dir: Path) -> None:
        model_dir = Path(model_dir)
        index = model_dir / "model.safetensors.index.json"
        if index.is_file():
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        elif (model_dir / "model.safetensors").is_file():
            files = ["model.safetensors"]
        else:
            raise ValueError(f"{model_dir} has no model.safetensors nor model.safetensors.index.json")
        self._entries: dict[str, tuple[Path, int, torch.dtype, tuple[int, ...]]] = {}
        for name in files:
            path = model_dir / name
            with open(path, "rb") as handle:
                header_len = int.from_bytes(handle.read(8), "little")
                header = json.loads(handle.read(header_len))
            for key, meta in header.items():
                if key == "__metadata__":
                    continue
                if meta["dtype"] not in SAFETENSORS_DTYPES:
                    raise ValueError(f"{path}: tensor {key} has dtype {meta['dtype']}, which the learner cannot read")
                start = 8 + header_len + meta["data_offsets"][0]
                self._entries[key] = (path, start, SAFETENSORS_DTYPES[meta["dtype"]], tuple(meta["shape"]))

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def shape(self, key: str) -> tuple[int, ...]:
        return self._entries[key][3]

    def rows(self, key: str, start: int, count: int) -> torch.Tensor:
        """Rows [start, start + count) of dimension 0 of tensor `key` (the whole of a 0-d tensor)."""
        path, offset, dtype, shape = self._entries[key]
        row_numel = math.prod(shape[1:]) if shape else 1
        itemsize = torch.empty((), dtype=dtype).element_size()
        size = count * row_numel * itemsize
        buffer = bytearray(size)
        with open(path, "rb", buffering=0) as handle:
            view, read = memoryview(buffer), 0
            while read < size:
                got = os.preadv(handle.fileno(), [view[read:]], offset + start * row_numel * itemsize + read)
                if got == 0:
                    raise ValueError(f"{path}: tensor {key} is truncated")
                read += got
        tensor = torch.frombuffer(buffer, dtype=dtype) if size else torch.empty(0, dtype=dtype)
        return tensor.reshape((count, *shape[1:]) if shape else ())


def checkpoint_key(parameter_name: str) -> str:
    """A parameter of the peft-wrapped model -> its key in the base model's checkpoint."""
    name = parameter_name.removeprefix(_PEFT_PREFIX)
    return name.replace(".base_layer.", ".")


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (no memory, no random
    initialisation) while buffers are computed as usual."""
    from transformers.initialization import no_init_weights

    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        with no_init_weights():
            yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


@contextlib.contextmanager
def linear_stand_ins(model: torch.nn.Module) -> Iterator[None]:
    """Inside, every linear layer's meta weight is replaced by a float32 CPU tensor of its shape
    that takes no memory (one zero, expanded): peft then makes each adapter on the CPU in float32
    (it moves adapters to their base layer's device and dtype), with the same random draws as
    over a loaded model. The meta weights are put back on the way out."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    originals = [m.weight for m in linears]
    for module, weight in zip(linears, originals, strict=True):
        module.weight = torch.nn.Parameter(torch.zeros((), dtype=torch.float32).expand(weight.shape), False)
    try:
        yield
    finally:
        for module, weight in zip(linears, originals, strict=True):
            module.weight = weight


def _local_rows(param: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A parameter's storage on this rank and the first row of the full tensor it holds: FSDP2
    shards dimension 0 in torch.chunk pieces; a parameter left whole holds everything."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return param.data, 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return param.to_local(), int(offset[0]) if offset else 0


def build_policy(
    model_dir: Path, config: Any, ctx: DistContext, compute_dtype: torch.dtype, replicate_base: bool = False
) -> Any:
    """The peft-wrapped, sharded policy with this rank's part of the checkpoint's weights (see the
    module docstring). `config` is the run's TrainSettings; with `replicate_base`, every rank
    keeps the whole frozen base (no gathers of it) and only the adapter is sharded."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    model_dir = Path(model_dir)
    reader = SafetensorsReader(model_dir)
    with parameters_on_meta():
        base = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(model_dir), dtype=compute_dtype)
    base.requires_grad_(False)
    base.eval()
    with linear_stand_ins(base):
        model = add_lora(base, config)
    adapter = {name: param.detach().clone() for name, param in trainable_parameters(model)}
    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    missing = [
        name for name, _ in model.named_parameters() if name not in adapter and checkpoint_key(name) not in reader
    ]
    if missing:
        raise ValueError(f"{model_dir}: the checkpoint lacks {checkpoint_key(missing[0])} ({len(missing)} missing)")
    model = shard_model(model, ctx, compute_dtype, replicate_base=replicate_base)
    model.to_empty(device=ctx.device)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])
        for name, param in model.named_parameters():
            local, first = _local_rows(param)
            if local.numel() == 0:
                continue
            count = local.shape[0] if local.dim() else 1
            if name in adapter:
                full = adapter[name]
                part = full[first : first + count] if full.dim() else full
            else:
                part = reader.rows(checkpoint_key(name), first, count)
            local.copy_(part.to(local.dtype))
    return model
