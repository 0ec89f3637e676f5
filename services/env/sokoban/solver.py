"""The Sokoban oracle: BFS over (agent, box) states, giving the optimal next action from any state.

A state is (agent cell, box cell). From each state the four actions lead to a walk (the agent moves),
a push (the agent walks into the box and the box moves on), or nothing (a wall, the room's edge, or a
box that cannot move: a bump). `Solution` explores every state reachable from the start (at most
cells**2: 625 in a 5x5 room) and computes each one's distance to the nearest solved state (box on the
target) by a BFS backwards over the same edges. A state with no way to the target (the box in a
corner, or along a wall that has no target) is a deadlock: `distance` has no entry for it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from services.env.kit.grid import DIRECTIONS, Cell, step_cell
from services.env.sokoban.level import Level

State = tuple[Cell, Cell]  # (agent, box)
Outcome = Literal["walk", "push", "bump"]


def move(level: Level, state: State, direction: str) -> tuple[State, Outcome]:
    """The state after `direction` from `state`, and what happened."""
    agent, box = state
    nxt = step_cell(agent, direction)
    if not level.is_floor(nxt):
        return state, "bump"
    if nxt != box:
        return (nxt, box), "walk"
    beyond = step_cell(box, direction)
    if not level.is_floor(beyond):
        return state, "bump"
    return (nxt, beyond), "push"


@dataclass(frozen=True)
class Solution:
    """Distances to solved for every state reachable from the level's start (deadlocks left out)."""

    level: Level
    distance: dict[State, int] = field(repr=False)

    @classmethod
    def of(cls, level: Level) -> Solution:
        start: State = (level.agent, level.box)
        successors: dict[State, list[State]] = {}
        queue = deque([start])
        successors[start] = []
        while queue:
            state = queue.popleft()
            if state[1] == level.target:
                continue  # solved: the episode ends here
            for direction in DIRECTIONS:
                nxt, outcome = move(level, state, direction)
                if outcome == "bump":
                    continue
                successors[state].append(nxt)
                if nxt not in successors:
                    successors[nxt] = []
                    queue.append(nxt)
        predecessors: dict[State, list[State]] = {state: [] for state in successors}
        for state, nexts in successors.items():
            for nxt in nexts:
                predecessors[nxt].append(state)
        distance = {state: 0 for state in successors if state[1] == level.target}
        back = deque(distance)
        while back:
            state = back.popleft()
            for prev in predecessors[state]:
                if prev not in distance:
                    distance[prev] = distance[state] + 1
                    back.append(prev)
        return cls(level=level, distance=distance)

    @property
    def optimal_moves(self) -> int:
        """Moves of the shortest solution from the start."""
        return self.distance[(self.level.agent, self.level.box)]

    def moves_to_solve(self, state: State) -> int | None:
        """Moves of the shortest solution from `state`; None for a deadlock."""
        return self.distance.get(state)

    def optimal_action(self, state: State) -> str | None:
        """The first move of a shortest solution from `state` (ties: up, down, left, right);
        None when solved or deadlocked."""
        here = self.distance.get(state)
        if not here:
            return None
        for direction in DIRECTIONS:
            nxt, outcome = move(self.level, state, direction)
            if outcome != "bump" and self.distance.get(nxt) == here - 1:
                return direction
        raise AssertionError(f"no move from {state} gets closer to solved")

    def solve(self, state: State | None = None) -> list[str]:
        """The optimal action sequence from `state` (default: the start); [] for a deadlock."""
        state = (self.level.agent, self.level.box) if state is None else state
        actions: list[str] = []
        while (direction := self.optimal_action(state)) is not None:
            actions.append(direction)
            state, _ = move(self.level, state, direction)
        return actions
