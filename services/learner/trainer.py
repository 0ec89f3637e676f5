"""The optimiser steps of one TrainStep, run by every rank on its shard of the batch.

Reads top to bottom as the algorithm. The batch is split into `num_minibatches` mini-batches (one
optimiser step each), and `num_epochs` passes are made over them. For each mini-batch and each of
its micro-batches: the learner's log-probs (with gradient) and, with a KL term, the reference
log-probs (adapter disabled); the per-token loss (loss.py) weighted so that the sum over all
micro-batches of all ranks is the mini-batch's loss; backward. Then gradient clipping, a non-finite
check that skips the step, and AdamW at the scheduled learning rate.

Normalisation: the weights come from whole-mini-batch counts (`BatchTotals`), each rank
backpropagates `world_size * local_loss`, and FSDP2 averages gradients over ranks, so the gradient
is that of the whole mini-batch's loss for any number of ranks and any micro-batch size.

The "old" policy of the PPO ratio is the learner's own log-probs before the TrainStep's first
update: for the first mini-batch of a single pass they are the detached log-probs of its own
forward (ratio 1, the plain policy gradient); for later ones and later passes, which are off-policy
and where the clip (and clip-higher) binds, a no-grad pass computes them before the first update.
With `old_logprobs: rollout` the rollout engine's log-probs stand in for them and that pass is
skipped. Otherwise the rollout engine's log-probs enter only through the truncated
importance-sampling weights.

The `logprob_abs_diff_vs_rollout` check compares the learner's log-probs from before the first
update with the rollout engine's: over the whole first pass when the learner computes its own old
log-probs, and over the first mini-batch (the only one it sees before an update) with
`old_logprobs: rollout`. With LoRA dropout on, the first mini-batch's log-probs come from its
training forward and the check carries the dropout's noise: read it with dropout 0.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from services.learner.batch import ModelSpec, PolicyBatch, PreparedTrajectory, collate
from services.learner.distributed import DistContext, all_reduce
from services.learner.image_features import ImageFeatureCache
from services.learner.loss import aggregation_weights, policy_loss
from services.learner.optim import learning_rate_at, set_learning_rate
from services.learner.policy import reference_logprobs, token_logprobs

if TYPE_CHECKING:  # pydantic is not needed to train (the GPU check runs without it)
    from services.common.training import TrainSettings


@dataclass(frozen=True)
class BatchTotals:
    """Counts over the whole batch (every rank), known before the step."""

    num_trajectories: int
    num_generated_tokens: int
    num_tokens: int
    num_episodes: float  # the trajectories' shares summed: episodes, a windowed one counted once

    @classmethod
    def of(cls, items: Sequence[PreparedTrajectory]) -> BatchTotals:
        real = [item for item in items if item.weight > 0]
        return cls(
            num_trajectories=len(real),
            num_generated_tokens=sum(item.num_generated for item in real),
            num_tokens=sum(item.num_tokens for item in real),
            num_episodes=sum(item.share for item in real),
        )


@dataclass(frozen=True)
class MiniBatch:
    """This rank's share of one mini-batch and the counts of the whole mini-batch (every rank)."""

    items: list[PreparedTrajectory]
    totals: BatchTotals


@dataclass(frozen=True)
class StepOutcome:
    metrics: dict[str, float]
    skipped: bool
    num_steps: int


class Sums:
    """Token-level sums by name, accumulated over micro-batches, then over ranks: kept as one float64
    tensor so that one all_reduce adds them all."""

    NAMES = ("loss", "pg_loss", "kl", "clipped", "entropy", "abs_diff", "checked", "generated", "is_weight")

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.tensor = torch.zeros(len(self.NAMES), dtype=torch.float64, device=device)

    def add(self, **values: torch.Tensor) -> None:
        """Adds one value to every sum (each name given once)."""
        assert set(values) == set(self.NAMES), sorted(set(values) ^ set(self.NAMES))
        self.tensor += torch.stack([values[name].to(self.tensor.device) for name in self.NAMES]).double()

    def add_sums(self, other: Sums) -> None:
        self.tensor += other.tensor.to(self.tensor.device)

    def __getitem__(self, name: str) -> float:
        return float(self.tensor[self.NAMES.index(name)])


def micro_batches(items: Sequence[PreparedTrajectory], size: int) -> list[list[PreparedTrajectory]]:
    """Chunks of at most `size` distinct sequences (`PreparedTrajectory.sequence_key`) of similar
    length, each sequence with every trajectory of it: sorted by token count first, so a chunk is
    padded only to its own longest trajectory (multi-turn episodes range from a few turns to
    `max_moves` turns), and `collate` runs each sequence through the model once. The step does not
    depend on how trajectories are grouped (see above)."""
    same: dict[tuple[bytes, ...], list[PreparedTrajectory]] = {}
    for item in items:
        same.setdefault(item.sequence_key, []).append(item)
    ordered = sorted(same.values(), key=lambda group: group[0].num_tokens)
    return [[item for group in ordered[i : i + size] for item in group] for i in range(0, len(ordered), size)]


def set_lora_dropout(model: Any, training: bool) -> None:
    """Switches LoRA dropout on or off; the base model always stays in eval mode."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Dropout) and ".lora_dropout." in f"{name}.":
            module.train(training)


def _batches(minibatch: MiniBatch, config: TrainSettings, spec: ModelSpec) -> list[PolicyBatch]:
    return [
        collate(chunk, spec.pad_token_id, spec.image_token_id)
        for chunk in micro_batches(minibatch.items, config.optim.micro_batch_size)
    ]


@torch.no_grad()
def _old_logprobs(model: Any, batches: list[PolicyBatch], device: torch.device) -> list[torch.Tensor]:
    return [token_logprobs(model, batch, device, with_entropy=False)[0] for batch in batches]


def old_policy_logprobs(
    model: Any, chunked: list[list[PolicyBatch]], config: TrainSettings, device: torch.device
) -> list[list[torch.Tensor] | None]:
    """Per mini-batch, the old policy's log-probs of each micro-batch, or None where the
    mini-batch's own forward gives them (the first one, before any update, when it is trained on
    only once)."""
    if config.loss.old_logprobs == "rollout":
        return [[batch.rollout_logprobs.to(device) for batch in batches] for batches in chunked]
    first = None if config.optim.epochs == 1 else _old_logprobs(model, chunked[0], device)
    return [first, *(_old_logprobs(model, batches, device) for batches in chunked[1:])]


def _accumulate_gradients(
    model: Any,
    batches: list[PolicyBatch],
    totals: BatchTotals,
    old: list[torch.Tensor] | None,
    config: TrainSettings,
    ctx: DistContext,
    check: bool,
) -> tuple[Sums, torch.Tensor]:
    """Forward/backward over one mini-batch's micro-batches; returns this rank's (sums, max |diff|).
    With `check`, the learner's log-probs before any update are compared with the rollout's."""
    device = ctx.device
    sums = Sums(device)
    max_abs_diff = torch.zeros((), dtype=torch.float64, device=device)
    for index, batch in enumerate(batches):
        mask = (batch.loss_mask * batch.weights[:, None]).to(device)
        ref = reference_logprobs(model, batch, device) if config.loss.kl_coef > 0 else None
        if hasattr(model, "set_requires_gradient_sync"):  # FSDP2: reduce-scatter once, at the end
            model.set_requires_gradient_sync(index == len(batches) - 1)
        bonus = config.loss.entropy_coef > 0
        logprobs, entropy = token_logprobs(model, batch, device, entropy_grad=bonus)
        assert entropy is not None
        old_logprobs = logprobs.detach() if old is None else old[index]
        rollout = batch.rollout_logprobs.to(device)
        terms = policy_loss(
            logprobs,
            old_logprobs,
            batch.advantages.to(device),
            clip_low=config.loss.clip_low,
            clip_high=config.loss.clip_high,
            rollout_logprobs=rollout,
            tis_cap=config.loss.tis_cap,
            ref_logprobs=ref,
            kl_coef=config.loss.kl_coef,
            entropy=entropy,
            entropy_coef=config.loss.entropy_coef,
        )
        weights = aggregation_weights(
            mask, config.loss.loss_agg, totals.num_generated_tokens, totals.num_episodes, batch.shares
        )
        loss = (weights * terms.total).sum()
        (loss * ctx.world_size).backward()
        with torch.no_grad():
            # The learner's log-probs before any update of this TrainStep (module docstring).
            before = old_logprobs if config.loss.old_logprobs == "learner" else logprobs.detach()
            checked = mask if check else torch.zeros_like(mask)
            abs_diff = (before - rollout).abs() * checked
            sums.add(
                loss=loss.detach(),
                pg_loss=(weights * terms.policy_gradient).sum(),
                kl=(weights * terms.kl).sum() if terms.kl is not None else loss.new_zeros(()),
                clipped=(terms.clipped.float() * mask).sum(),
                entropy=(entropy.detach() * mask).sum(),
                abs_diff=abs_diff.sum(),
                checked=checked.sum(),
                generated=mask.sum(),
                is_weight=(terms.is_weight * mask).sum() if terms.is_weight is not None else mask.sum(),
            )
            max_abs_diff = torch.maximum(max_abs_diff, abs_diff.max().double())
    return sums, max_abs_diff


def _optimizer_step(
    model: Any, optimizer: torch.optim.Optimizer, config: TrainSettings, step: int, loss: float
) -> tuple[float, bool]:
    """Clips, then steps unless the loss or the gradient is not finite; returns (grad norm, skipped)."""
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm_t = torch.nn.utils.clip_grad_norm_(params, config.optim.max_grad_norm, foreach=False)
    if hasattr(grad_norm_t, "full_tensor"):  # a DTensor under FSDP2: the same value on every rank
        grad_norm_t = grad_norm_t.full_tensor()
    grad_norm = float(grad_norm_t)
    skipped = not (math.isfinite(loss) and math.isfinite(grad_norm))
    if not skipped:
        set_learning_rate(optimizer, learning_rate_at(step, config))
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, skipped


def train_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    minibatches: Sequence[MiniBatch],
    config: TrainSettings,
    step: int,
    spec: ModelSpec,
    ctx: DistContext,
    images: ImageFeatureCache | None = None,
) -> StepOutcome:
    """One optimiser step per mini-batch in each of `config.optim.epochs` passes over them, starting
    at optimiser step `step`. Every rank holds the same number of items per mini-batch (padding
    copies have weight 0). With `images`, the frozen vision tower runs once per distinct frame of
    the step, before any update. Collective."""
    chunked = [_batches(minibatch, config, spec) for minibatch in minibatches]
    image_metrics = {}
    if images is not None:
        hits, misses, start = images.hits, images.misses, time.perf_counter()
        images.attach(model, [batch for batches in chunked for batch in batches], ctx.device)
        image_metrics = {
            "train/image_frames_encoded": float(images.misses - misses),
            "train/image_frames_cached": float(images.hits - hits),
            "train/image_encode_s": time.perf_counter() - start,
        }
    old = old_policy_logprobs(model, chunked, config, ctx.device)  # before the first update
    distinct = all_reduce(torch.tensor(float(sum(b.input_ids.shape[0] for bs in chunked for b in bs)),
                                       dtype=torch.float64, device=ctx.device))
    totals = Sums()
    max_abs_diff = 0.0
    losses, pg_losses, kls, grad_norms, num_skipped = [], [], [], [], 0
    passes = [
        (index, minibatch, batches)
        for _ in range(config.optim.epochs)
        for index, (minibatch, batches) in enumerate(zip(minibatches, chunked, strict=True))
    ]
    set_lora_dropout(model, True)
    try:
        for offset, (index, minibatch, batches) in enumerate(passes):
            check = offset == 0 or (config.loss.old_logprobs == "learner" and offset < len(minibatches))
            sums, max_diff = _accumulate_gradients(
                model, batches, minibatch.totals, old[index], config, ctx, check
            )
            all_reduce(sums.tensor)
            all_reduce(max_diff, op="max")
            grad_norm, skipped = _optimizer_step(model, optimizer, config, step + offset, sums["loss"])
            totals.add_sums(sums)
            max_abs_diff = max(max_abs_diff, float(max_diff))
            losses.append(sums["loss"])
            pg_losses.append(sums["pg_loss"])
            kls.append(sums["kl"])
            grad_norms.append(grad_norm)
            num_skipped += skipped
    finally:
        set_lora_dropout(model, False)

    total = totals
    generated = max(total["generated"], 1.0)
    metrics = {
        "train/loss": statistics.fmean(losses),
        "train/pg_loss": statistics.fmean(pg_losses),
        "train/clip_fraction": total["clipped"] / generated,
        "train/entropy": total["entropy"] / generated,
        "train/grad_norm": statistics.fmean(grad_norms),
        "train/learning_rate": learning_rate_at(step + len(passes) - 1, config),
        "train/logprob_abs_diff_vs_rollout": total["abs_diff"] / max(total["checked"], 1.0),
        "train/logprob_abs_diff_vs_rollout_max": max_abs_diff,
        "train/num_trajectories": float(sum(m.totals.num_trajectories for m in minibatches)),
        "train/num_tokens": float(sum(m.totals.num_tokens for m in minibatches)),
        "train/num_generated_tokens": float(sum(m.totals.num_generated_tokens for m in minibatches)),
        "train/num_distinct_sequences": float(distinct),
        "train/optimizer_steps": float(len(passes)),
        "train/skipped": float(num_skipped > 0),
        "train/skipped_steps": float(num_skipped),
        **image_metrics,
    }
    if config.loss.kl_coef > 0:
        metrics["train/kl"] = statistics.fmean(kls)
    if config.loss.tis_cap is not None:
        metrics["train/tis_weight_mean"] = total["is_weight"] / generated
    return StepOutcome(metrics=metrics, skipped=num_skipped > 0, num_steps=len(passes))
