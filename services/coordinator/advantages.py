"""Group-relative advantages (GRPO), computed from terminal rewards on the coordinator side.

For a group of G episodes that played the same task, with rewards r_1..r_G:

    A_i = (r_i - mean(r)) / (std(r) + eps)     normalize="std"   (GRPO)
    A_i =  r_i - mean(r)                        normalize="none"  (Dr. GRPO: no std scaling)

std is the population standard deviation (ddof=0). A group whose rewards are all equal gets
A_i = 0 for every member: it carries no learning signal (DAPO's dynamic sampling drops it).
The per-token advantage is the advantage of the token's turn on generated tokens and 0 elsewhere.

Discounting (`discounted_return`): with a discount gamma < 1 the return of an episode of T turns is
gamma**(T - 1) * r, so of two episodes that both reach the goal the shorter one scores higher. The
environment's reward stays sparse; a group whose members all solve the maze in different numbers of
moves then still carries a signal (fewer wall bumps and detours), which gamma = 1 ignores.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Hashable, Sequence
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


def returns_to_go(reward: float, turns: int, discount: float = 1.0) -> list[float]:
    """The return from each of `turns` turns when the only reward came on the last one."""
    return [discounted_return(reward, turns - t, discount) for t in range(turns)]


def step_advantages(
    states: Sequence[Sequence[Hashable]], returns: Sequence[Sequence[float]], normalize: Normalize = "std"
) -> list[list[float]]:
    """GiGPO step-level advantages of one group: `states[i][t]` identifies the state episode i acted
    from at turn t, `returns[i][t]` the return from that turn. Shapes [G][T_i] -> [G][T_i]."""
    if [len(s) for s in states] != [len(r) for r in returns]:
        raise ValueError("states and returns differ in shape")
    anchors: dict[Hashable, list[tuple[int, int]]] = defaultdict(list)
    for i, episode_states in enumerate(states):
        for t, state in enumerate(episode_states):
            anchors[state].append((i, t))
    out = [[0.0] * len(r) for r in returns]
    for members in anchors.values():
        if len(members) > 1:
            for (i, t), advantage in zip(members, group_advantages([returns[i][t] for i, t in members], normalize),
                                         strict=True):
                out[i][t] = advantage
    return out


def is_informative(rewards: Sequence[float]) -> bool:
    """False when every reward in the group is equal (all advantages are zero)."""
    return max(rewards) - min(rewards) > 1e-12


def per_turn_token_advantages(
    turn_advantages: Sequence[float], loss_mask: Sequence[int], turn_starts: Sequence[int]
) -> list[float]:
    """Each turn's advantage on the generated tokens of that turn (turn t spans the record from
    `turn_starts[t]` to the next turn's start); 0 elsewhere."""
    if len(turn_advantages) != len(turn_starts):
        raise ValueError(f"{len(turn_advantages)} turn advantages for {len(turn_starts)} turns")
    return [turn_advantages[bisect_right(turn_starts, j) - 1] if m else 0.0 for j, m in enumerate(loss_mask)]
