"""Learner checkpoints: adapter, optimizer, schedule position (the step), step and RNG states,
written atomically under `<shared_root>/runs/<run>/checkpoints/step_<N>/`:

    adapter_model.safetensors, adapter_config.json   the adapter (peft format, loadable as is)
    optimizer.pt       AdamW state as a full (unsharded) state dict keyed by parameter path
    rng.pt             every rank's Python and torch (CPU, CUDA) generator states
    trainer_state.json run id, step, adapter version, world size, base model, the run config
    manifest.json      sha256 of every file (storage.publish_directory)

Full state dicts are gathered to rank 0 with torch.distributed.checkpoint's state-dict helpers
and loaded back with `broadcast_from_rank0=True`, so a checkpoint does not depend on the number
of ranks that wrote it (an empty optimizer.pt: saved before the first optimiser step).
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from services.common import storage
from services.learner.publish import read_adapter, write_adapter

log = logging.getLogger("mmrl.learner.checkpoint")

OPTIMIZER = "optimizer.pt"
RNG = "rng.pt"
TRAINER_STATE = "trainer_state.json"


@dataclass(frozen=True)
class TrainerState:
    """The scalar part of a checkpoint (trainer_state.json)."""

    run_id: str
    step: int  # optimiser steps
    train_steps: int  # TrainStep calls (GRPO steps)
    adapter_version: int
    world_size: int
    base_model: str
    config: dict[str, Any]


# -- collectives (every rank calls them; full tensors land on rank 0) ------------------------------

_GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)


def gather_adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """The trainable (LoRA) weights as full CPU tensors on rank 0, {} elsewhere."""
    state: dict[str, torch.Tensor] = dict(get_model_state_dict(model, options=_GATHER))  # type: ignore[arg-type]
    return state


def gather_optimizer_state(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state as a full CPU state dict keyed by parameter path on rank 0 ({}
    elsewhere, and {} everywhere before the first optimiser step: gathering an empty AdamW would
    initialise it with a zero-lr step, advancing its bias-correction step count)."""
    if not optimizer.state:
        return {}
    return dict(get_optimizer_state_dict(model, optimizer, options=_GATHER))


_SCATTER = StateDictOptions(
    full_state_dict=True, broadcast_from_rank0=True, ignore_frozen_params=True, strict=False
)


def load_adapter_state(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Loads full adapter weights held by rank 0 (others pass {}) into the (sharded) model. Keys
    and shapes were checked on rank 0 before; strict=False only skips the frozen base weights."""
    set_model_state_dict(model, dict[str, Any](state), options=_SCATTER)


def load_optimizer_state(model: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Loads a full optimizer state dict held by rank 0 (others pass {})."""
    set_optimizer_state_dict(model, optimizer, state, options=_SCATTER)


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_rng(seed: int, rank: int) -> None:
    """Fresh generators for a rank that has no saved state (a new run, or more ranks than saved)."""
    random.seed(seed * 1000 + rank)
    torch.manual_seed(seed * 1000 + rank)


# -- files (rank 0) ---------------------------------------------------------------------------------


def write_checkpoint(
    shared_root: Path,
    state: TrainerState,
    adapter_state: dict[str, torch.Tensor],
    optim_state: dict[str, Any],
    rng_states: list[dict[str, Any]],
    peft_config: Any,
) -> tuple[Path, float]:
    """Atomically writes the checkpoint of `state.step`; returns (directory, milliseconds)."""
    start = time.perf_counter()
    final = storage.checkpoint_dir(shared_root, state.run_id, state.step)

    def write(tmp: Path) -> None:
        write_adapter(tmp, adapter_state, peft_config)
        torch.save(optim_state, tmp / OPTIMIZER)
        torch.save(rng_states, tmp / RNG)
        (tmp / TRAINER_STATE).write_text(json.dumps(asdict(state), indent=2, sort_keys=True))

    storage.publish_directory(final, write, extra_manifest={"run_id": state.run_id, "step": state.step})
    return final, (time.perf_counter() - start) * 1000.0


def load_trainer_state(directory: Path) -> TrainerState:
    """The scalar state of a checkpoint (no manifest check). Checkpoints written before
    `train_steps` was recorded get it from their optimiser steps: `num_minibatches` per TrainStep."""
    saved = json.loads((Path(directory) / TRAINER_STATE).read_text())
    if "train_steps" not in saved:
        saved["train_steps"] = int(saved["step"]) // int(saved["config"].get("num_minibatches", 1))
    return TrainerState(**saved)


CheckpointTensors = tuple[dict[str, torch.Tensor], dict[str, Any], list[dict[str, Any]]]


def read_checkpoint_tensors(directory: Path, expected_shapes: dict[str, torch.Size]) -> CheckpointTensors:
    """(adapter weights, optimizer state, per-rank RNG states) of a verified checkpoint.

    Raises ValueError when the adapter does not fit the model or the optimizer state names a
    parameter the model does not train (a parameter without state, e.g. before the first step,
    starts with fresh AdamW moments)."""
    adapter_state = read_adapter(directory, expected_shapes)
    optim_state = torch.load(directory / OPTIMIZER, weights_only=True)
    if optim_state and set(optim_state.get("state", {})) - set(expected_shapes):
        raise ValueError(f"{directory}: optimizer state names parameters the model does not train")
    rng_states = torch.load(directory / RNG, weights_only=True)
    return adapter_state, optim_state, rng_states


def newest_valid_checkpoint(shared_root: Path, run_id: str) -> Path | None:
    """The run's newest checkpoint that verifies against its manifest (older ones are tried when a
    newer one fails, with a warning)."""
    for step, path in reversed(storage.list_checkpoints(shared_root, run_id)):
        try:
            storage.verify_manifest(path)
        except storage.ManifestError as exc:
            log.warning(
                "skipping a checkpoint that fails its manifest", extra={"step": step, "error": str(exc)}
            )
            continue
        return path
    return None
