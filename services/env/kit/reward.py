"""Per-turn rewards a grid environment can give besides the contract's 1.0 on the solving turn.

The `reward` option of a task: `sparse` (the default) gives 1.0 on the turn that solves it and 0.0 on
every other turn. `progress` adds potential-based shaping (Ng, Harada and Russell, 1999) from the env's
own oracle: every turn earns the share of the way to the solution it covered,

    r_t += (d(s_t) - d(s_t+1)) / d(s_0)

with d the oracle's moves to solve from a state (the maze's BFS distance to the goal, Sokoban's moves
to push the box home). Over an episode these telescope to (d(s_0) - d(s_T)) / d(s_0): 1 for a solve, the
share of the way covered for a failure, and a move there and back earns nothing, so the shaping
ranks episodes by how far they got without changing which policy is best. A state from which the
task can no longer be solved (Sokoban's stuck box) counts as d = 2 d(s_0): such an episode ends with
-1 of shaping.

`progress` leaves a turn that changes nothing (a bump, an unreadable action) at 0.0, so it ranks a
policy that stands still above one that explores and sometimes steps the wrong way. `paced` adds a
price on time: every turn also pays the share of one move, 1 / d(s_0), so a move along a shortest
solution breaks even, a turn that changes nothing costs 1 / d(s_0) and a move away 2 / d(s_0). Over
an episode of T turns the shaping sums to (d(s_0) - d(s_T) - T) / d(s_0): 0 for a solve in the fewest
moves, less for each move beyond them.

Eval sets play `sparse` unless their specs say otherwise; solve rates come from info.solved, not
from rewards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from services.common.messages import shown
from services.env.errors import invalid

RewardMode = Literal["sparse", "progress", "paced"]
MODES: tuple[RewardMode, ...] = ("sparse", "progress", "paced")


def reward_option(options: Mapping[str, str], where: str) -> RewardMode:
    """The task's `reward` option (default sparse); INVALID_ARGUMENT for another value."""
    text = options.get("reward", "sparse").strip().lower()
    if text not in MODES:
        raise invalid(f"{where}.options.reward", f"must be one of {', '.join(MODES)}, got {shown(text)}")
    return text  # type: ignore[return-value]


def progress(before: int, after: int | None, start: int) -> float:
    """The shaping of one turn from `before` to `after` moves to solve (None: unsolvable), on a task
    `start` moves from solved at its first observation."""
    if start <= 0:
        return 0.0
    after_or_lost = 2 * start if after is None else after
    return (before - after_or_lost) / start


def shaping(mode: RewardMode, before: int, after: int | None, start: int) -> float:
    """A turn's reward besides the solving 1.0 under `mode`: none (sparse), `progress`, or `progress`
    less the share of one move (paced)."""
    if mode == "sparse" or start <= 0:
        return 0.0
    return progress(before, after, start) - (1.0 / start if mode == "paced" else 0.0)
