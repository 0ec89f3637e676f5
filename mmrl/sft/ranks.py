"""The SFT's model on the learner's code path: built, sharded across ranks and saved as the GRPO
learner builds and gathers its policy (services/learner/distributed.py, weights.py).

- `finetune: full`: every weight trains. Each rank loads the checkpoint in float32 and FSDP2 shards
  it when there are several ranks or a compute dtype below float32 (parameters and AdamW state stay
  float32, forward and backward run in bfloat16 on GPU). Meant for small models: every rank reads
  the whole model once.
- `finetune: lora`: a LoRA adapter (`lora` settings) on the frozen base. Sharded, the base is built
  without a full copy on any rank (`weights.build_policy`: each rank reads only its shard, in the
  compute dtype); the saved model has the adapter merged in (`export.merge_adapter`). The way to
  warm-start an 8B model.

A single float32 rank (the CPU demo) is the unsharded model, computed exactly as before the ranks
existed. Every function here that touches the model is collective: all ranks call it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from services.common.training import TrainSettings
from services.learner.distributed import DistContext, is_sharded, plan_shards, shard_model
from services.learner.engine import resolve_dtype
from services.learner.policy import add_lora, load_base_model


def compute_dtype(config: Any, ctx: DistContext) -> torch.dtype:
    return resolve_dtype(config.dtype, ctx.device)


def build_model(config: Any, ctx: DistContext) -> Any:
    """The model to fine-tune, on this rank, in training mode where it trains."""
    base = Path(config.base_model)
    dtype = compute_dtype(config, ctx)
    if config.finetune == "lora":
        from services.learner.weights import build_policy

        settings = lora_settings(config)
        if is_sharded(ctx, dtype):
            return build_policy(base, settings, ctx, dtype)
        return shard_model(add_lora(load_base_model(base), settings), ctx, dtype)
    model = load_base_model(base)
    model.requires_grad_(True)  # full fine-tune: every weight trains
    model.train()
    return shard_model(model, ctx, dtype)


def lora_settings(config: Any) -> TrainSettings:
    return TrainSettings(seed=config.seed, lora=config.lora)


def this_ranks_share(items: list[Any], ctx: DistContext) -> list[Any]:
    """This rank's trajectories of a batch every rank holds (padding copies where it comes up short)."""
    if ctx.world_size == 1:
        return items
    shard = plan_shards([item.num_tokens for item in items], ctx.world_size)[ctx.rank]
    return [items[i].as_padding() if padding else items[i] for i, padding in shard]


def save_model(model: Any, processor: Any, config: Any, ctx: DistContext, out: Path, report: dict[str, Any],
               swap_in: Any) -> None:
    """Writes the fine-tuned model as a complete HF model directory `out` (rank 0 writes; the
    gathering is collective). `swap_in(tmp, out)` puts the finished directory in place."""
    tmp = out.parent / f".tmp-{out.name}"
    if config.finetune == "lora":
        _save_merged(model, config, ctx, tmp)
    else:
        state = _full_state(model, config, ctx)
        if ctx.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_pretrained(tmp, safe_serialization=True, state_dict=state)
            processor.save_pretrained(tmp)
    if ctx.is_main:
        (tmp / "sft_report.json").write_text(json.dumps(report, indent=2))
        swap_in(tmp, out)


def _full_state(model: Any, config: Any, ctx: DistContext) -> dict[str, torch.Tensor] | None:
    """Every weight as a full CPU tensor on rank 0 (None: the unsharded model saves its own)."""
    if not is_sharded(ctx, compute_dtype(config, ctx)):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return dict(get_model_state_dict(model, options=options))  # type: ignore[arg-type]


def _save_merged(model: Any, config: Any, ctx: DistContext, tmp: Path) -> None:
    from mmrl.export import merge_adapter
    from services.learner.checkpoint import gather_adapter_state
    from services.learner.publish import write_adapter

    state = gather_adapter_state(model)
    if not ctx.is_main:
        return
    inner = model.module if hasattr(model, "module") else model
    peft_config = inner.peft_config["default"]
    with tempfile.TemporaryDirectory(prefix="mmrl-sft-adapter-") as adapter_dir:
        write_adapter(Path(adapter_dir), state, peft_config)
        merge_adapter(Path(adapter_dir), tmp, base_model=Path(config.base_model), force=True)
