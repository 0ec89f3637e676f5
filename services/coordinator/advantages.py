"""Group-relative advantages (GRPO), computed from terminal rewards on the coordinator side.

For a group of G episodes that played the same task, with rewards r_1..r_G:

    A_i = (r_i - mean(r)) / (std(r) + eps)     normalize="std"   (GRPO)
    A_i =  r_i - mean(r)                        normalize="none"  (Dr. GRPO: no std scaling)

std is the population standard deviation (ddof=0). A group whose rewards are all equal gets
A_i = 0 for every member: it carries no learning signal (DAPO's dynamic sampling drops it).
The per-token advantage is A_i on the episode's generated tokens and 0 elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

Normalize = Literal["std", "none"]


def group_advantages(rewards: Sequence[float], normalize: Normalize = "std", eps: float = 1e-6) -> list[float]:
    """Advantages of one group (shape [G] -> [G])."""
    if not rewards:
        raise ValueError("a group needs at least one reward")
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if normalize == "none":
        return centred
    if normalize != "std":
        raise ValueError(f"normalize must be 'std' or 'none', got {normalize!r}")
    std = math.sqrt(sum(c * c for c in centred) / len(rewards))
    return [c / (std + eps) for c in centred]


def is_informative(rewards: Sequence[float]) -> bool:
    """False when every reward in the group is equal (all advantages are zero)."""
    return max(rewards) - min(rewards) > 1e-12


def per_token_advantages(advantage: float, loss_mask: Sequence[int]) -> list[float]:
    """Broadcasts an episode advantage onto its generated tokens (mask 1); 0 elsewhere."""
    return [advantage if m else 0.0 for m in loss_mask]
