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

No-op turns (`noop_turns`): a turn after which the next observation is the one it acted from changed
nothing (in the maze: a wall bump or an unparseable action, which cost a move). With a no-op
penalty c > 0 such a turn's advantage is lowered by c, whatever the episode's outcome: a dense,
per-turn signal that a sparse reward gives only at the end of an episode (and a failing group, all
0, not at all). The solve rate the runs report stays the environment's sparse reward.

Path credit (`loop_erased_turns`, `path_advantages`): in an episode with a positive advantage,
the turns cut out of its loop-erased path (wall bumps, detours that came back) get 0 instead of
that advantage ("drop"), or their credit moves onto the path's turns ("shift").
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Literal

Normalize = Literal["std", "none"]
PathCredit = Literal["off", "drop", "shift"]


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


def loop_erased_turns(observation_keys: Sequence[Hashable], turns: int) -> list[bool]:
    """Per turn, whether it is on the episode's loop-erased path: walking the turns in order, a
    return to an observation already on the path cuts the path back to it, so wall bumps (the same
    observation again) and detours that came back drop out. In a deterministic environment whose
    observation is its state, the remaining turns alone lead from the start to where the episode
    ended (in a maze without cycles: the shortest way)."""
    _check_observations(observation_keys, turns)
    path: list[tuple[Hashable, int]] = []  # (observation, the turn taken from it), start to end
    position: dict[Hashable, int] = {}
    for t in range(turns):
        key = observation_keys[t]
        if key in position:  # back where the path already was: cut the loop out
            cut = position[key]
            for dropped, _ in path[cut:]:
                del position[dropped]
            del path[cut:]
        position[key] = len(path)
        path.append((key, t))
    on_path = {t for _, t in path}
    return [t in on_path for t in range(turns)]


def path_advantages(advantage: float, on_path: Sequence[bool], mode: PathCredit) -> list[float]:
    """The per-turn advantages of an episode with episode-level advantage `advantage` whose turns
    are (not) on its loop-erased path. Only a positive advantage is moved: "drop" leaves the path's
    turns their advantage and gives the others 0; "shift" moves the episode's whole credit onto its
    path (each path turn gets advantage * turns / path turns), so the winners' total is kept."""
    if mode not in ("off", "drop", "shift"):
        raise ValueError(f"path credit must be 'off', 'drop' or 'shift', got {mode!r}")
    turns = len(on_path)
    if mode == "off" or advantage <= 0.0 or all(on_path):
        return [advantage] * turns
    share = advantage * turns / sum(on_path) if mode == "shift" else advantage
    return [share if on else 0.0 for on in on_path]


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
