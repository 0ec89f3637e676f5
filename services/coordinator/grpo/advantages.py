"""Group-relative advantages (GRPO), computed on the coordinator side.

For a group of G episodes that played the same task, with returns r_1..r_G:

    A_i = (r_i - mean(r)) / (std(r) + eps)     normalize="std"   (GRPO)
    A_i =  r_i - mean(r)                        normalize="none"  (Dr. GRPO: no std scaling)

std is the population standard deviation (ddof=0). A group whose rewards are all equal gets
A_i = 0 for every member: it carries no learning signal (DAPO's dynamic sampling drops it).
The per-token advantage is the advantage of the token's turn on generated tokens and 0 elsewhere.

Returns (`discounted_return`): an episode's return is the sum of every turn's reward, the turn t
one weighted by gamma**t: sparse rewards (the maze's 1.0 on the solving turn) and shaped ones
alike. With gamma < 1 of two episodes that both succeed the shorter scores higher.

No-op turns (`noop_turns`): a turn after which the next observation is the one it acted from changed
nothing (in the maze: a wall bump or an unparseable action); their share is a step metric.
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


def discounted_return(rewards: Sequence[float], discount: float = 1.0) -> float:
    """The return of an episode whose turns earned `rewards`: sum of gamma**t * r_t."""
    if not 0.0 < discount <= 1.0:
        raise ValueError(f"discount must be in (0, 1], got {discount}")
    if not rewards:
        raise ValueError("an episode has at least one turn")
    return sum(r * discount**t for t, r in enumerate(rewards))


def returns_to_go(rewards: Sequence[float], discount: float = 1.0) -> list[float]:
    """The return from each turn on: G_t = sum over k >= t of gamma**(k - t) * r_k."""
    out = [0.0] * len(rewards)
    following = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        following = rewards[t] + discount * following
        out[t] = following
    return out


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


def _check_observations(observation_keys: Sequence[Hashable], turns: int) -> None:
    """An episode of `turns` turns acted from `turns` observations, plus one more if it was cut at
    the turn limit (an episode that ended has no observation after its last turn)."""
    if not turns <= len(observation_keys) <= turns + 1:
        raise ValueError(f"{len(observation_keys)} observations for {turns} turns")


def noop_turns(observation_keys: Sequence[Hashable], turns: int) -> list[bool]:
    """Per turn of an episode of `turns` turns, whether it was a no-op: the observation after it
    (`observation_keys[t + 1]`) is the one it acted from (`observation_keys[t]`). The last turn
    of an episode that ended has no next observation and is not a no-op."""
    _check_observations(observation_keys, turns)
    return [t + 1 < len(observation_keys) and observation_keys[t + 1] == observation_keys[t] for t in range(turns)]


def revisit_turns(observation_keys: Sequence[Hashable], turns: int) -> list[bool]:
    """Per turn of an episode of `turns` turns, whether the observation after it is one the episode
    had already seen: a no-op (`noop_turns`), or the move that closes a loop. A policy that sees the
    current observation alone acts again as it did there, so such a move wastes the moves since."""
    _check_observations(observation_keys, turns)
    seen: set[Hashable] = set()
    revisits = []
    for t in range(turns):
        seen.add(observation_keys[t])
        revisits.append(t + 1 < len(observation_keys) and observation_keys[t + 1] in seen)
    return revisits


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
