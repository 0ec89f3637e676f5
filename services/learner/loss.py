"""The policy-gradient maths, as small pure functions on per-token tensors.

Shapes: every per-token tensor is [B, K]: B trajectories, K scored positions (the generated
tokens of a micro-batch, see `batch.PolicyBatch.target_cols`); `mask` is 1.0 on generated tokens
and 0.0 elsewhere. Nothing here knows about ranks or micro-batches: the trainer passes
`aggregation_weights` computed from whole-batch counts, so summing `weights * loss` over every
micro-batch on every rank gives the loss of the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

LossAggregation = Literal["token_mean", "sequence_mean"]


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate with separate lower and upper clip (DAPO's clip-higher), per token:

        r_t = exp(logp_t - logp_old_t)
        L_t = -min(r_t * A_t, clip(r_t, 1 - clip_low, 1 + clip_high) * A_t)

    Returns (L [B, K], clipped [B, K] bool: the clipped branch is the smaller one, so the token
    gets no gradient). Gradients flow through `logprobs` only.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || pi_ref) on tokens sampled from pi, per token:

        d_t = logp_ref_t - logp_t
        k3_t = exp(d_t) - d_t - 1        (>= 0, unbiased, 0 where the policies agree)

    Returns [B, K]; gradients flow through `logprobs`.
    """
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


def truncated_is_weights(
    learner_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """Truncated importance-sampling weights correcting for the rollout engine sampling from a
    slightly different distribution than the learner computes, per token:

        w_t = min(exp(logp_learner_t - logp_rollout_t), cap)

    Returns [B, K], detached (a weight, not a path for gradients).
    """
    return torch.clamp(torch.exp(learner_logprobs - rollout_logprobs), max=cap).detach()


def aggregation_weights(
    mask: torch.Tensor, mode: LossAggregation, num_tokens: int, num_sequences: float,
    shares: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token weights w such that sum(w * L) is the batch loss, given whole-batch counts:

        token_mean:    w_bt = m_bt / N                    N = generated tokens in the whole batch
        sequence_mean: w_bt = m_bt * s_b / (n_b * S)      n_b = generated tokens of trajectory b,
                                                          s_b = its share of its episode,
                                                          S = the shares summed (episodes)

    A trajectory's share is 1 / segments: an episode cut into T trajectories (a windowed
    conversation) counts once, like one trajectory of the whole episode; `shares` None = all 1.
    `mask` is [B, K] (0/1, float); `num_tokens` / `num_sequences` count the whole batch across
    micro-batches and ranks. Returns [B, K] (zeros for a count of 0).
    """
    if mode == "token_mean":
        return mask / max(num_tokens, 1)
    if mode == "sequence_mean":
        per_sequence = mask.sum(dim=1, keepdim=True).clamp(min=1.0)
        share = 1.0 if shares is None else shares.to(mask)[:, None]
        return mask * share / (per_sequence * (num_sequences if num_sequences > 0 else 1.0))
    raise ValueError(f"unknown loss aggregation {mode!r}")


@dataclass(frozen=True)
class TokenLosses:
    """Per-token terms of the policy loss, each [B, K]."""

    total: torch.Tensor
    """is_weight * L_pg + kl_coef * k3: what is aggregated and differentiated."""
    policy_gradient: torch.Tensor
    """is_weight * L_pg."""
    kl: torch.Tensor | None
    """k3 to the reference policy, when a reference was given."""
    clipped: torch.Tensor
    """Where the clipped branch of the surrogate was taken."""
    is_weight: torch.Tensor | None
    """The truncated importance-sampling weights, when enabled."""


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    rollout_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
) -> TokenLosses:
    """The per-token GRPO/DAPO loss:

        L_t = w_t * clipped_surrogate_t + kl_coef * k3_t - entropy_coef * H_t

    with w_t = truncated_is_weights(old_logprobs, rollout_logprobs, tis_cap) when `tis_cap` is
    set (1 otherwise), k3 computed when `ref_logprobs` is given and H_t the entropy of the
    token's distribution (with its gradient) when `entropy_coef` > 0.
    """
    pg, clipped = clipped_surrogate(logprobs, old_logprobs, advantages, clip_low, clip_high)
    is_weight = None
    if tis_cap is not None:
        if rollout_logprobs is None:
            raise ValueError("tis_cap needs rollout_logprobs")
        is_weight = truncated_is_weights(old_logprobs, rollout_logprobs, tis_cap)
        pg = pg * is_weight
    total = pg
    kl = None
    if ref_logprobs is not None:
        kl = kl_k3(logprobs, ref_logprobs)
        total = total + kl_coef * kl
    if entropy_coef > 0:
        if entropy is None or not entropy.requires_grad:
            raise ValueError("entropy_coef needs the entropy with its gradient")
        total = total - entropy_coef * entropy
    return TokenLosses(total=total, policy_gradient=pg, kl=kl, clipped=clipped, is_weight=is_weight)
