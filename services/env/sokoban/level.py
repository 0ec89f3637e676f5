"""Sokoban levels of one box and one target, generated from a seed by reverse play.

Coordinates. A level is a square room of `size` x `size` cells (default 5), cell (r, c) 0-based from
the top-left; outside the room is wall (the frame shows the room only, so the frame's edge is the
outer wall). Inside it a few cells are wall too; the rest is floor. The agent moves one cell per
action (up, down, left, right); walking into the box pushes it one cell on, unless a wall (or the
room's edge) is behind it. The level is solved when the box stands on the target.

Generation, driven only by `random.Random(f"mmrl-sokoban:{size}:{pulls}:{seed}")` (the same arguments
give the same level on every machine and Python version since 3.2):
1. Inner walls: 0..size*size//6 random cells (4 in a 5x5 room), redrawn until the floor is connected.
2. The solved state: the box on a random floor cell, which is the target, and the agent on another.
3. Reverse play: up to `pulls` times the agent walks (around the box) to a cell next to it and pulls
   it one cell, stepping back itself; the reversed pulls are pushes, so every level is solvable.
   The number of pulls is drawn from 1..`pulls`; a level whose box ends on the target is redrawn.
4. The agent then walks to a random cell it can reach: its start.
The oracle (`services/env/sokoban/solver.py`) then finds the optimal solution by BFS.

Seeds and levels (services/env/kit/seeds.py): training seeds lie in [0, 1e6), eval sets take seeds in
[1e6, 2e6); and a level (walls, target, box and agent start: `level_key`) is reserved for evaluation
when its hash falls in the reserved share (`is_eval_level`). Eval sets hold reserved levels only;
training never plays one.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from dataclasses import dataclass

from services.env.kit.grid import DIRECTIONS, Cell, step_cell
from services.env.kit.seeds import is_reserved

MIN_SIZE = 3
MAX_SIZE = 12
DEFAULT_SIZE = 5
DEFAULT_PULLS = 4


@dataclass(frozen=True)
class Level:
    """A generated level: room side, wall cells inside it, the target, and the box and agent at start."""

    seed: int
    size: int
    pulls: int
    walls: frozenset[Cell]
    target: Cell
    box: Cell
    agent: Cell

    def is_floor(self, cell: Cell) -> bool:
        """Whether `cell` is inside the room and not a wall."""
        return 0 <= cell[0] < self.size and 0 <= cell[1] < self.size and cell not in self.walls

    def layout_text(self) -> str:
        """The room as text, one row per line: '#' wall, '.' floor, 'T' target, 'B' box, 'A' agent."""
        rows = []
        for r in range(self.size):
            row = ""
            for c in range(self.size):
                cell = (r, c)
                row += ("#" if cell in self.walls else "B" if cell == self.box else "A" if cell == self.agent
                        else "T" if cell == self.target else ".")
            rows.append(row)
        return "\n".join(rows)


def level_key(level: Level) -> bytes:
    """Identifies the level (walls, target, box, agent start): equal keys, the same task."""
    return hashlib.sha256(f"mmrl-sokoban:{level.size}\n{level.layout_text()}".encode()).digest()


def is_eval_level(key: bytes) -> bool:
    """Whether the level with this `level_key` is reserved for eval sets (training never plays it)."""
    return is_reserved(key)


def reachable(level_floor: frozenset[Cell], start: Cell, blocked: Cell) -> set[Cell]:
    """Floor cells the agent reaches from `start` without passing `blocked` (the box)."""
    seen = {start}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        for direction in DIRECTIONS:
            nxt = step_cell(cell, direction)
            if nxt in level_floor and nxt != blocked and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def _connected(floor: frozenset[Cell]) -> bool:
    first = min(floor)
    return len(reachable(floor, first, (-1, -1))) == len(floor)


def _cells(size: int) -> list[Cell]:
    return [(r, c) for r in range(size) for c in range(size)]


def _draw_walls(rng: random.Random, size: int) -> frozenset[Cell]:
    while True:
        walls = frozenset(rng.sample(_cells(size), rng.randint(0, size * size // 6)))
        floor = frozenset(_cells(size)) - walls
        if len(floor) >= 3 and _connected(floor):
            return walls


def _pull_options(floor: frozenset[Cell], agent: Cell, box: Cell) -> list[tuple[Cell, Cell, Cell]]:
    """(cell the agent pulls from, box's new cell, agent's new cell) for every pull the agent can reach."""
    around = reachable(floor, agent, box)
    options = []
    for direction in DIRECTIONS:
        beside = step_cell(box, direction)  # the agent stands here and steps on in `direction`
        back = step_cell(beside, direction)
        if beside in around and back in floor:
            options.append((beside, beside, back))
    return options


def generate_level(seed: int, size: int = DEFAULT_SIZE, pulls: int = DEFAULT_PULLS) -> Level:
    """The level of (seed, size, pulls) by reverse play (module docstring); ValueError for bad arguments."""
    if not MIN_SIZE <= size <= MAX_SIZE:
        raise ValueError(f"size must be in [{MIN_SIZE}, {MAX_SIZE}], got {size}")
    if pulls < 1:
        raise ValueError(f"pulls must be >= 1, got {pulls}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    rng = random.Random(f"mmrl-sokoban:{size}:{pulls}:{seed}")
    while True:
        walls = _draw_walls(rng, size)
        floor = frozenset(_cells(size)) - walls
        ordered = sorted(floor)
        target = rng.choice(ordered)
        box = target
        agent = rng.choice([cell for cell in ordered if cell != box])
        for _ in range(rng.randint(1, pulls)):
            options = _pull_options(floor, agent, box)
            if not options:
                break
            _, box, agent = rng.choice(options)
        if box == target:
            continue
        agent = rng.choice(sorted(reachable(floor, agent, box)))
        return Level(seed=seed, size=size, pulls=pulls, walls=walls, target=target, box=box, agent=agent)
