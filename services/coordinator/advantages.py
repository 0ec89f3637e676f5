"""Group-relative advantages (GRPO), computed from terminal rewards on the coordinator side.

For a group of G episodes that played the same task, with rewards r_1..r_G:

    A_i = (r_i - mean(r)) / (std(r) + eps)     normalize="std"   (GRPO)
    A_i =  r_i - mean(r)                        normalize="none"  (Dr. GRPO: no std scaling)

std is the population standard deviation (ddof=0). A group whose rewards are all equal gets
A_i = 0 for every member: it carries no learning signal (DAPO's dynamic sampling drops it).
The per-token advantage is A_i on the episode's generated tokens and 0 elsewhere.

Discounting (`discounted_return`): with a discount gamma < 1 the return of an episode of T turns is
gamma**(T - 1) * r, so of two episodes that both reach the goal the shorter one scores higher. The
environment's reward stays sparse; a group whose members all solve the maze in different numbers of
moves then still carries a signal (fewer wall bumps and detours), which gamma = 1 ignores.
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


def discounted_return(reward: float, turns: int, discount: float = 1.0) -> float:
    """The return of an episode of `turns` turns whose only reward `reward` came on its last turn."""
    if not 0.0 < discount <= 1.0:
        raise ValueError(f"discount must be in (0, 1], got {discount}")
    if turns < 1:
        raise ValueError(f"an episode has at least one turn, got {turns}")
    return reward * discount ** (turns - 1)


def is_informative(rewards: Sequence[float]) -> bool:
    """False when every reward in the group is equal (all advantages are zero)."""
    return max(rewards) - min(rewards) > 1e-12


def per_token_advantages(advantage: float, loss_mask: Sequence[int]) -> list[float]:
    """Broadcasts an episode advantage onto its generated tokens (mask 1); 0 elsewhere."""
    return [advantage if m else 0.0 for m in loss_mask]
