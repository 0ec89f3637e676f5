"""One optimiser step on a batch of trajectories, run by every rank on its shard.

Reads top to bottom as the algorithm: for each micro-batch, the learner's log-probs (with
gradient) and, with a KL term, the reference log-probs (adapter disabled); the per-token loss
(loss.py) weighted so that the sum over all micro-batches of all ranks is the whole batch's loss;
backward. Then gradient clipping, a non-finite check that skips the step, and AdamW at the
scheduled learning rate.

Normalisation: the weights come from whole-batch counts (`BatchTotals`), each rank backpropagates
`world_size * local_loss`, and FSDP2 averages gradients over ranks, so the gradient is that of
the whole-batch loss for any number of ranks and any micro-batch size.

The "old" policy of the PPO ratio is the learner's own log-probs before the update (detached),
since each batch gets one optimiser step; the rollout engine's log-probs enter only through
the truncated importance-sampling weights and the `logprob_abs_diff_vs_rollout` check.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from services.learner.batch import ModelSpec, PreparedTrajectory, collate
from services.learner.config import LearnerRunConfig
from services.learner.distributed import DistContext, all_reduce
from services.learner.loss import aggregation_weights, policy_loss
from services.learner.optim import learning_rate_at, set_learning_rate
from services.learner.policy import reference_logprobs, token_logprobs


@dataclass(frozen=True)
class BatchTotals:
    """Counts over the whole batch (every rank), known before the step."""

    num_trajectories: int
    num_generated_tokens: int
    num_tokens: int

    @classmethod
    def of(cls, items: Sequence[PreparedTrajectory]) -> BatchTotals:
        real = [item for item in items if item.weight > 0]
        return cls(
            num_trajectories=len(real),
            num_generated_tokens=sum(item.num_generated for item in real),
            num_tokens=sum(item.num_tokens for item in real),
        )


@dataclass(frozen=True)
class StepOutcome:
    metrics: dict[str, float]
    skipped: bool


# Sums accumulated over micro-batches and then over ranks, in this order.
_SUMS = ("loss", "pg_loss", "kl", "clipped", "entropy", "abs_diff", "generated", "is_weight")


def micro_batches(items: Sequence[PreparedTrajectory], size: int) -> list[list[PreparedTrajectory]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def set_lora_dropout(model: Any, training: bool) -> None:
    """Switches LoRA dropout on or off; the base model always stays in eval mode."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Dropout) and ".lora_dropout." in f"{name}.":
            module.train(training)


def train_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    items: Sequence[PreparedTrajectory],
    totals: BatchTotals,
    config: LearnerRunConfig,
    step: int,
    spec: ModelSpec,
    ctx: DistContext,
) -> StepOutcome:
    """One optimiser step on this rank's shard `items` (every rank has the same number of items;
    padding copies have weight 0). Collective: every rank must call it."""
    device = ctx.device
    sums = torch.zeros(len(_SUMS), dtype=torch.float64, device=device)
    max_abs_diff = torch.zeros((), dtype=torch.float64, device=device)
    chunks = micro_batches(items, config.micro_batch_size)
    set_lora_dropout(model, True)
    try:
        for index, chunk in enumerate(chunks):
            batch = collate(chunk, spec.pad_token_id, spec.image_token_id)
            mask = (batch.loss_mask * batch.weights[:, None]).to(device)
            ref = reference_logprobs(model, batch, device) if config.kl_coef > 0 else None
            if hasattr(model, "set_requires_gradient_sync"):  # FSDP2: reduce-scatter once, at the end
                model.set_requires_gradient_sync(index == len(chunks) - 1)
            logprobs, entropy = token_logprobs(model, batch, device)
            assert entropy is not None
            rollout = batch.rollout_logprobs.to(device)
            terms = policy_loss(
                logprobs,
                logprobs.detach(),
                batch.advantages.to(device),
                clip_low=config.clip_low,
                clip_high=config.clip_high,
                rollout_logprobs=rollout,
                tis_cap=config.tis_cap,
                ref_logprobs=ref,
                kl_coef=config.kl_coef,
            )
            weights = aggregation_weights(
                mask, config.loss_agg, totals.num_generated_tokens, totals.num_trajectories
            )
            loss = (weights * terms.total).sum()
            (loss * ctx.world_size).backward()
            with torch.no_grad():
                abs_diff = (logprobs.detach() - rollout).abs() * mask
                sums += torch.stack(
                    [
                        loss.detach(),
                        (weights * terms.policy_gradient).sum(),
                        (weights * terms.kl).sum() if terms.kl is not None else loss.new_zeros(()),
                        (terms.clipped.float() * mask).sum(),
                        (entropy * mask).sum(),
                        abs_diff.sum(),
                        mask.sum(),
                        (terms.is_weight * mask).sum() if terms.is_weight is not None else mask.sum(),
                    ]
                ).double()
                if abs_diff.numel():
                    max_abs_diff = torch.maximum(max_abs_diff, abs_diff.max().double())
    finally:
        set_lora_dropout(model, False)
    all_reduce(sums)
    all_reduce(max_abs_diff, op="max")
    total = dict(zip(_SUMS, sums.tolist(), strict=True))

    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm_t = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm, foreach=False)
    if hasattr(grad_norm_t, "full_tensor"):
        grad_norm_t = grad_norm_t.full_tensor()
    grad_norm = float(grad_norm_t)
    lr = learning_rate_at(step, config)
    skipped = not (math.isfinite(total["loss"]) and math.isfinite(grad_norm))
    if not skipped:
        set_learning_rate(optimizer, lr)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    generated = max(total["generated"], 1.0)
    metrics = {
        "train/loss": total["loss"],
        "train/pg_loss": total["pg_loss"],
        "train/clip_fraction": total["clipped"] / generated,
        "train/entropy": total["entropy"] / generated,
        "train/grad_norm": grad_norm,
        "train/learning_rate": lr,
        "train/logprob_abs_diff_vs_rollout": total["abs_diff"] / generated,
        "train/logprob_abs_diff_vs_rollout_max": float(max_abs_diff),
        "train/num_trajectories": float(totals.num_trajectories),
        "train/num_tokens": float(totals.num_tokens),
        "train/num_generated_tokens": float(totals.num_generated_tokens),
        "train/skipped": float(skipped),
    }
    if config.kl_coef > 0:
        metrics["train/kl"] = total["kl"]
    if config.tis_cap is not None:
        metrics["train/tis_weight_mean"] = total["is_weight"] / generated
    return StepOutcome(metrics=metrics, skipped=skipped)
