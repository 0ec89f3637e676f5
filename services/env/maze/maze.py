"""Perfect mazes carved from a seed, and their BFS solver (the oracle for SFT data and tests).

Coordinates. A maze is a square grid of odd side `size` that includes the outer wall, with
`n = (size - 1) // 2` cells per side (9x9 grid = 4x4 cells). Cell (r, c), 0-based from the top-left,
sits on grid unit (2r+1, 2c+1); the unit between two neighbouring cells is a wall or a passage, and
units at (even, even) positions are always wall. One move goes from a cell to an adjacent cell, two
grid units. Start defaults to the top-left cell and goal to the bottom-right cell.

Generation is randomized depth-first search (the recursive backtracker: a random spanning tree of the
cell graph, so every maze is perfect, with exactly one path between any two cells; its long corridors
spread the shortest-path lengths wider than Wilson's uniform trees do: 6-14 moves on 4x4 cells,
about half of them longer than 6), driven only by `random.Random(seed)`: the same
(seed, size) gives the same layout on every machine and Python version since 3.2. The eval-set
content hash (`evalset.py`) pins this; changing generation changes that hash and fails its test.

Solver: BFS distances to the goal are computed once per maze (`Maze.distance`); `solve` gives the
optimal action sequence, `optimal_action` the optimal next action from any cell.

Seeds and layouts (services/env/kit/seeds.py, the contract that keeps training away from the eval
sets of `evalset.py`): eval sets take seeds in [1e6, 2e6), training seeds lie below. Disjoint seeds are
not disjoint mazes: the backtracker carves few distinct 4x4 layouts (about 3,800 over the first
100,000 seeds), so every eval maze also comes from some training seed. Layouts are therefore split
too: a layout is reserved for evaluation when its hash falls in the reserved share (`is_eval_layout`,
about one layout in 8). Eval sets hold only reserved layouts; training mazes skip them
(`is_training_seed`), so no eval maze is ever trained on, whatever its seed.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from collections import deque
from dataclasses import dataclass

import numpy as np

from services.common.messages import shown
from services.env.kit.grid import DIRECTIONS, STOP, Cell, Direction
from services.env.kit.seeds import EVAL_SEED_MAX, EVAL_SEED_MIN, TRAIN_SEED_LIMIT, distinct_seeds, is_reserved

ACTIONS: tuple[str, ...] = (*DIRECTIONS, STOP)  # every action word the maze reads
MIN_SIZE = 5  # 2x2 cells; smaller grids have at most one cell
_CELL = re.compile(r"^\s*\(?\s*(\d{1,9})\s*,\s*(\d{1,9})\s*\)?\s*$")  # 9 digits: int() never refuses


def layout_key(seed: int, size: int) -> bytes:
    """Identifies the layout (the walls) of the maze of (seed, size): equal keys, the same maze."""
    check_size(size)
    walls = _carve_backtracker(num_cells_per_side(size), random.Random(seed))
    return hashlib.sha256(f"mmrl-layout:{size}:".encode() + np.packbits(walls).tobytes()).digest()


def is_eval_layout(key: bytes) -> bool:
    """Whether the layout with this `layout_key` is reserved for eval sets (training never plays it)."""
    return is_reserved(key)


def is_training_seed(seed: int, size: int) -> bool:
    """Whether training may play the maze of (seed, size): a training seed whose layout is not reserved."""
    return 0 <= seed < TRAIN_SEED_LIMIT and not is_eval_layout(layout_key(seed, size))


def option_flag(text: str) -> bool | None:
    """A yes/no maze option (`require_stop`) as written: True for true/1/yes, False for false/0/no,
    ignoring case and surrounding spaces; None for anything else."""
    word = text.strip().lower()
    if word in ("true", "1", "yes"):
        return True
    if word in ("false", "0", "no"):
        return False
    return None


@functools.lru_cache(maxsize=16)
def training_seeds(first_seed: int, count: int, size: int) -> tuple[int, ...]:
    """The first `count` training seeds from `first_seed` on (skipping reserved layouts); ValueError
    when they would reach the eval seed range. Cached: the SFT asks for the same list at every
    frame-reading update, and 2,000 mazes take about 70 ms to carve."""
    seeds: list[int] = []
    seed = first_seed if first_seed + count <= TRAIN_SEED_LIMIT else TRAIN_SEED_LIMIT  # too many: fail at once
    while len(seeds) < count:
        if seed >= TRAIN_SEED_LIMIT:
            raise ValueError(f"{count} training mazes from seed {first_seed} reach the eval seed range "
                             f"(>= {TRAIN_SEED_LIMIT:,})")
        if is_training_seed(seed, size):
            seeds.append(seed)
        seed += 1
    return tuple(seeds)


def eval_seeds(first_seed: int, count: int, size: int, exclude: frozenset[bytes] = frozenset()) -> list[int]:
    """The first `count` eval-range seeds from `first_seed` on whose layouts are reserved for eval,
    distinct, and not among the `exclude` layout keys; ValueError when the eval range runs out."""
    if first_seed < EVAL_SEED_MIN:
        raise ValueError(f"eval mazes start in the eval seed range (>= {EVAL_SEED_MIN:,}), not at {first_seed}")
    try:
        return distinct_seeds(range(first_seed, EVAL_SEED_MAX), count, lambda seed: layout_key(seed, size),
                              reserved=True, exclude=exclude)
    except ValueError:
        raise ValueError(f"{count} eval mazes from seed {first_seed} leave the eval seed range "
                         f"[{EVAL_SEED_MIN:,}, {EVAL_SEED_MAX:,})") from None


def parse_cell(text: str, n: int) -> Cell:
    """The cell written `row,col` (or `(row, col)`) within the n x n cells; ValueError saying what is wrong."""
    match = _CELL.match(text)
    if match is None:
        raise ValueError(f"must be a cell 'row,col', got {shown(text)}")
    cell = (int(match.group(1)), int(match.group(2)))
    if not (cell[0] < n and cell[1] < n):
        raise ValueError(f"cell {shown(text)} is outside the {n}x{n} cells")
    return cell


def num_cells_per_side(size: int) -> int:
    return (size - 1) // 2


def check_size(size: int) -> None:
    """Raises ValueError unless `size` is a valid grid side (odd, at least MIN_SIZE)."""
    if size % 2 == 0:
        raise ValueError(f"must be odd, got {size}")
    if size < MIN_SIZE:
        raise ValueError(f"must be at least {MIN_SIZE}, got {size}")


@dataclass(frozen=True, eq=False)
class Maze:
    """A generated maze. Arrays are read-only.

    walls: bool (size, size), True where the grid unit is wall.
    distance: int32 (n, n), the number of moves from each cell to the goal along the unique path.
    """

    seed: int
    size: int
    start: Cell
    goal: Cell
    walls: np.ndarray
    distance: np.ndarray

    @property
    def num_cells_per_side(self) -> int:
        return num_cells_per_side(self.size)

    @property
    def optimal_moves(self) -> int:
        """Moves on the shortest path from start to goal."""
        return int(self.distance[self.start])

    def can_move(self, cell: Cell, direction: Direction) -> bool:
        """Whether the move leaves `cell` through a passage (the outer wall is always wall)."""
        d_row, d_col = DIRECTIONS[direction]
        return not bool(self.walls[2 * cell[0] + 1 + d_row, 2 * cell[1] + 1 + d_col])

    def neighbour(self, cell: Cell, direction: Direction) -> Cell | None:
        """The cell reached by the move, or None when a wall is in the way."""
        if not self.can_move(cell, direction):
            return None
        d_row, d_col = DIRECTIONS[direction]
        return (cell[0] + d_row, cell[1] + d_col)

    def layout_text(self) -> str:
        """The grid as text, one row per line: '#' wall, '.' floor, 'S' start, 'G' goal."""
        chars = np.where(self.walls, "#", ".")
        chars[2 * self.start[0] + 1, 2 * self.start[1] + 1] = "S"
        chars[2 * self.goal[0] + 1, 2 * self.goal[1] + 1] = "G"
        return "\n".join("".join(row) for row in chars)


def generate_maze(seed: int, size: int, start: Cell | None = None, goal: Cell | None = None) -> Maze:
    """Carves the maze of `seed` on a `size` x `size` grid (randomized DFS, deterministic).

    The layout depends only on (seed, size); start and goal only choose where the agent and the goal
    are. Raises ValueError for an invalid size, a negative seed, cells outside the maze, or
    start == goal.
    """
    check_size(size)
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")  # random.Random(-s) == random.Random(s)
    n = num_cells_per_side(size)
    start = (0, 0) if start is None else start
    goal = (n - 1, n - 1) if goal is None else goal
    for name, cell in (("start", start), ("goal", goal)):
        if not (0 <= cell[0] < n and 0 <= cell[1] < n):
            raise ValueError(f"{name} {cell} is outside the {n}x{n} cells")
    if start == goal:
        raise ValueError(f"start and goal are the same cell {start}")
    walls = _carve_backtracker(n, random.Random(seed))
    distance = _distances_from(walls, goal)
    walls.setflags(write=False)
    distance.setflags(write=False)
    return Maze(seed=seed, size=size, start=start, goal=goal, walls=walls, distance=distance)


def _carve_backtracker(n: int, rng: random.Random) -> np.ndarray:
    """Randomized depth-first search (recursive backtracker, iterative): from a random cell, carve to a
    random unvisited neighbour; back up when there is none. Visits every cell once: a spanning tree."""
    walls = np.ones((2 * n + 1, 2 * n + 1), dtype=bool)
    visited = [[False] * n for _ in range(n)]
    first = (rng.randrange(n), rng.randrange(n))
    visited[first[0]][first[1]] = True
    walls[2 * first[0] + 1, 2 * first[1] + 1] = False
    stack = [first]
    while stack:
        row, col = stack[-1]
        unvisited = [
            (row + d_row, col + d_col)
            for d_row, d_col in DIRECTIONS.values()
            if 0 <= row + d_row < n and 0 <= col + d_col < n and not visited[row + d_row][col + d_col]
        ]
        if not unvisited:
            stack.pop()
            continue
        row2, col2 = rng.choice(unvisited)
        visited[row2][col2] = True
        walls[2 * row2 + 1, 2 * col2 + 1] = False
        walls[row + row2 + 1, col + col2 + 1] = False  # the wall unit between the two cells
        stack.append((row2, col2))
    return walls


def _distances_from(walls: np.ndarray, source: Cell) -> np.ndarray:
    """BFS over cells: moves from `source` to every cell (-1 where unreachable)."""
    n = num_cells_per_side(walls.shape[0])
    distance = np.full((n, n), -1, dtype=np.int32)
    distance[source] = 0
    queue = deque([source])
    while queue:
        row, col = queue.popleft()
        for d_row, d_col in DIRECTIONS.values():
            if walls[2 * row + 1 + d_row, 2 * col + 1 + d_col]:
                continue
            nxt = (row + d_row, col + d_col)
            if distance[nxt] < 0:
                distance[nxt] = distance[row, col] + 1
                queue.append(nxt)
    return distance


def optimal_direction(maze: Maze, cell: Cell) -> Direction | None:
    """The first move of the shortest path from `cell` to the goal, None on the goal."""
    if cell == maze.goal:
        return None
    here = int(maze.distance[cell])
    for direction in DIRECTIONS:
        nxt = maze.neighbour(cell, direction)
        if nxt is not None and int(maze.distance[nxt]) == here - 1:
            return direction
    raise AssertionError(f"no move from {cell} gets closer to the goal")  # impossible in a perfect maze


def optimal_action(maze: Maze, cell: Cell) -> str:
    """The optimal next action from `cell` as action text: a direction, or "stop" on the goal."""
    direction = optimal_direction(maze, cell)
    return STOP if direction is None else direction


def solve(maze: Maze, cell: Cell | None = None, require_stop: bool = False) -> list[str]:
    """The optimal action sequence from `cell` (default: the start) to the goal.

    With `require_stop` (VisGym-compatible mode) the sequence ends with "stop" on the goal.
    Its length without "stop" equals `maze.distance[cell]`, the optimal number of moves.
    """
    cell = maze.start if cell is None else cell
    actions: list[str] = []
    while (direction := optimal_direction(maze, cell)) is not None:
        actions.append(direction)
        d_row, d_col = DIRECTIONS[direction]
        cell = (cell[0] + d_row, cell[1] + d_col)
    if require_stop:
        actions.append(STOP)
    return actions


def optimal_moves(maze: Maze, cell: Cell | None = None) -> int:
    """Moves on the shortest path from `cell` (default: the start) to the goal."""
    return int(maze.distance[maze.start if cell is None else cell])
