"""The learner's state on one rank and the commands every rank runs in lockstep.

Rank 0's `LearnerDriver` (driver.py) validates each request, then sends the command to the
other ranks and runs it itself; the other ranks run it from `driver.worker_loop`. Everything
here that touches the model is collective: every rank must run the same command sequence.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from services.common import adapter_probe, storage
from services.common.constrained import ActionMask
from services.common.training import TrainSettings
from services.learner import checkpoint as ckpt
from services.learner import image_features
from services.learner.batch import FrameProcessor, ModelSpec
from services.learner.config import LearnerSettings
from services.learner.distributed import (
    DistContext,
    broadcast_object,
    gather_objects,
    is_sharded,
    scatter_objects,
    shard_model,
)
from services.learner.optim import build_optimizer
from services.learner.policy import (
    ADAPTER_NAME,
    add_lora,
    load_base_model,
    load_processor,
    model_module_kinds,
    trainable_parameters,
)
from services.learner.publish import PublishedAdapter, publish_adapter
from services.learner.trainer import MiniBatch, StepOutcome, set_lora_dropout, train_step
from services.learner.weights import build_policy

log = logging.getLogger("mmrl.learner")


@dataclass(frozen=True)
class LearnerState:
    run_id: str
    step: int
    adapter_version: int
    restored_from: str
    train_steps: int


@dataclass
class _Run:
    run_id: str
    config: TrainSettings
    model: Any
    optimizer: torch.optim.Optimizer
    step: int = 0  # optimiser steps (the learning-rate schedule position)
    train_steps: int = 0  # TrainStep calls (GRPO steps)
    adapter_version: int = 0
    restored_from: str = ""
    images: image_features.ImageFeatureCache | None = None  # the vision tower's outputs per frame, when usable


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


class LearnerEngine:
    """One rank's model, optimizer and counters."""

    def __init__(self, settings: LearnerSettings, ctx: DistContext) -> None:
        from transformers import AutoConfig

        self.settings = settings
        self.ctx = ctx
        if settings.num_threads is not None:
            torch.set_num_threads(settings.num_threads)
        self.model_dir = Path(settings.model).resolve()
        processor = load_processor(self.model_dir)
        self.frames = FrameProcessor(processor.image_processor)
        self.probe_ids = adapter_probe.probe_token_ids(processor.tokenizer)
        self.module_kinds = model_module_kinds(self.model_dir)
        self.spec = ModelSpec.from_config(AutoConfig.from_pretrained(self.model_dir))
        self.compute_dtype = resolve_dtype(settings.dtype, ctx.device)
        self.run: _Run | None = None

    # -- queries ------------------------------------------------------------------------------------

    def state(self) -> LearnerState:
        assert self.run is not None
        run = self.run
        return LearnerState(run.run_id, run.step, run.adapter_version, run.restored_from, run.train_steps)

    @property
    def action_mask(self) -> ActionMask | None:
        """The run's constrained actions (its settings' action sequences), None for free text."""
        assert self.run is not None
        sequences = self.run.config.action_sequences
        return ActionMask(sequences) if sequences else None

    def trainable_shapes(self) -> dict[str, torch.Size]:
        assert self.run is not None
        return {name: param.shape for name, param in trainable_parameters(self.run.model)}

    # -- commands (collective) -----------------------------------------------------------------------

    def configure(self, run_id: str, config: TrainSettings, adapter_version: int) -> LearnerState:
        """Builds a fresh model with a new (identity) adapter and optimizer for `run_id`."""
        self.run = None
        gc.collect()
        if is_sharded(self.ctx, self.compute_dtype):  # each rank reads only its shard of the weights
            model = build_policy(
                self.model_dir, config, self.ctx, self.compute_dtype, replicate_base=self.settings.replicate_base
            )
        else:
            model = shard_model(add_lora(load_base_model(self.model_dir, torch.float32), config), self.ctx,
                                self.compute_dtype)
        optimizer = build_optimizer((p for _, p in trainable_parameters(model)), config)
        images = None
        if self.settings.image_cache_mb > 0 and image_features.usable(
            model, is_sharded(self.ctx, self.compute_dtype)
        ):
            images = image_features.ImageFeatureCache(self.settings.image_cache_mb << 20)
        self.run = _Run(
            run_id=run_id, config=config, model=model, optimizer=optimizer, adapter_version=adapter_version,
            images=images,
        )
        ckpt.seed_rng(config.seed, self.ctx.rank)
        log.info("configured run", extra={"run_id": run_id, "rank": self.ctx.rank, **self.state().__dict__})
        return self.state()

    def train(self, minibatches: list[MiniBatch]) -> StepOutcome:
        assert self.run is not None
        run = self.run
        outcome = train_step(
            run.model, run.optimizer, minibatches, run.config, run.step, self.spec, self.ctx, run.images
        )
        run.step += outcome.num_steps
        run.train_steps += 1
        return outcome

    def publish(self, version: int) -> PublishedAdapter | None:
        """Writes the adapter as `version` with its probe (services/common/adapter_probe.py) in the
        manifest (rank 0 writes; returns None on other ranks)."""
        assert self.run is not None
        run = self.run
        probe = self._probe()
        state = ckpt.gather_adapter_state(run.model)
        published = None
        if self.ctx.is_main:
            published = publish_adapter(
                self.settings.shared_root,
                run.run_id,
                version,
                state,
                self._peft_config(),
                extra_manifest={"step": run.step, "base_model": str(self.model_dir), **probe.to_manifest()},
            )
        run.adapter_version = version
        return published

    def _probe(self) -> adapter_probe.Probe:
        """The probe's log-probs with the adapter and without it (collective: every rank runs the
        forwards of the sharded model)."""
        assert self.run is not None
        model = self.run.model
        set_lora_dropout(model, False)
        return adapter_probe.measure(model, self.probe_ids, self.ctx.device)

    def save_checkpoint(self) -> tuple[Path, float] | None:
        """Writes the checkpoint of the current step (rank 0 writes; None on other ranks)."""
        assert self.run is not None
        run = self.run
        model_state = ckpt.gather_adapter_state(run.model)
        optim_state = ckpt.gather_optimizer_state(run.model, run.optimizer)
        rng_states = gather_objects(ckpt.capture_rng(), self.ctx)
        if not self.ctx.is_main:
            return None
        assert rng_states is not None
        trainer_state = ckpt.TrainerState(
            run_id=run.run_id,
            step=run.step,
            train_steps=run.train_steps,
            adapter_version=run.adapter_version,
            world_size=self.ctx.world_size,
            base_model=str(self.model_dir),
            config=run.config.model_dump(mode="json"),
        )
        return ckpt.write_checkpoint(
            self.settings.shared_root,
            trainer_state,
            model_state,
            optim_state,
            rng_states,
            self._peft_config(),
        )

    def reset(self) -> None:
        """Forgets the run (after a failed restore)."""
        self.run = None
        gc.collect()

    def load_checkpoint(self, directory: Path, loaded: ckpt.CheckpointTensors | None) -> LearnerState:
        """Restores adapter, optimizer, step and RNG from a checkpoint; rank 0 passes the tensors it
        read and checked (`ckpt.read_checkpoint_tensors`), the other ranks None."""
        assert self.run is not None
        run = self.run
        model_state, optim_state, rng_states = loaded if loaded is not None else ({}, {}, [])
        ckpt.load_adapter_state(run.model, model_state)
        if broadcast_object(bool(optim_state), self.ctx):
            ckpt.load_optimizer_state(run.model, run.optimizer, optim_state)
        else:  # saved before the first optimiser step: a fresh optimizer is the same state
            run.optimizer = build_optimizer((p for _, p in trainable_parameters(run.model)), run.config)
        steps = None
        if self.ctx.is_main:
            saved = ckpt.load_trainer_state(Path(directory))
            steps = (saved.step, saved.train_steps)
        run.step, run.train_steps = broadcast_object(steps, self.ctx)
        run.restored_from = str(directory)
        per_rank = [rng_states[r] if r < len(rng_states) else None for r in range(self.ctx.world_size)]
        mine = scatter_objects(per_rank if self.ctx.is_main else None, self.ctx)
        if mine is None:
            ckpt.seed_rng(run.config.seed + run.step, self.ctx.rank)
        else:
            ckpt.restore_rng(mine)
        return self.state()

    def _peft_config(self) -> Any:
        assert self.run is not None
        return self.run.model.peft_config[ADAPTER_NAME]


def existing_run_versions(shared_root: Path, run_id: str) -> int:
    """Newest complete adapter version of a run on disk (0 when none)."""
    versions = storage.list_adapter_versions(shared_root, run_id)
    return versions[-1][0] if versions else 0
