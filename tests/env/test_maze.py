"""Maze generation is perfect and deterministic; the BFS solver is optimal."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from services.env.kit.grid import DIRECTIONS
from services.env.maze.evalset import get_eval_set
from services.env.maze.maze import (
    Maze,
    generate_maze,
    optimal_action,
    optimal_direction,
    optimal_moves,
    option_flag,
    solve,
)

SIZES = (5, 7, 9, 11, 15, 21, 51)


def _open_passages(maze: Maze) -> int:
    """Open wall units between two horizontally or vertically adjacent cells."""
    walls = maze.walls
    horizontal = ~walls[1::2, 2:-1:2]  # between (r, c) and (r, c+1)
    vertical = ~walls[2:-1:2, 1::2]  # between (r, c) and (r+1, c)
    return int(horizontal.sum() + vertical.sum())


def _grid_distance(maze: Maze, source: tuple[int, int], target: tuple[int, int]) -> int:
    """Independent BFS over grid units (one unit per step); -1 when unreachable."""
    walls = maze.walls
    start, goal = (2 * source[0] + 1, 2 * source[1] + 1), (2 * target[0] + 1, 2 * target[1] + 1)
    seen = {start: 0}
    queue = deque([start])
    while queue:
        i, j = queue.popleft()
        if (i, j) == goal:
            return seen[(i, j)]
        for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            nxt = (i + di, j + dj)
            if not walls[nxt] and nxt not in seen:
                seen[nxt] = seen[(i, j)] + 1
                queue.append(nxt)
    return -1


@pytest.mark.parametrize("size", SIZES)
def test_mazes_are_perfect_connected_trees(size: int) -> None:
    for seed in range(20 if size < 51 else 3):
        maze = generate_maze(seed, size)
        n = maze.num_cells_per_side
        walls = maze.walls
        assert walls.shape == (size, size)
        assert walls[0].all() and walls[-1].all() and walls[:, 0].all() and walls[:, -1].all()
        assert walls[::2, ::2].all(), "units between four cells must be wall"
        assert not walls[1::2, 1::2].any(), "every cell is floor"
        assert _open_passages(maze) == n * n - 1
        reachable = maze.distance >= 0
        assert reachable.all(), "every cell reaches the goal"


def test_the_same_seed_gives_the_same_maze() -> None:
    for size in (9, 11, 25):
        first, second = generate_maze(123, size), generate_maze(123, size)
        assert np.array_equal(first.walls, second.walls)
        assert first.layout_text() == second.layout_text()


def test_different_seeds_give_different_mazes() -> None:
    layouts = {generate_maze(seed, 11).layout_text() for seed in range(200)}
    assert len(layouts) >= 195


def test_a_known_seed_has_a_pinned_layout() -> None:
    assert generate_maze(0, 9).layout_text() == "\n".join([
        "#########",
        "#S....#.#",
        "#.###.#.#",
        "#.#.....#",
        "#.#######",
        "#.#.....#",
        "#.#.###.#",
        "#.....#G#",
        "#########",
    ])


@pytest.mark.parametrize("size", [4, 8, 10, 3, 1, -1])
def test_invalid_sizes_are_rejected(size: int) -> None:
    with pytest.raises(ValueError):
        generate_maze(0, size)


def test_negative_seeds_and_bad_start_or_goal_are_rejected() -> None:
    with pytest.raises(ValueError, match="seed"):
        generate_maze(-1, 9)
    with pytest.raises(ValueError, match="outside"):
        generate_maze(0, 9, goal=(4, 0))
    with pytest.raises(ValueError, match="same cell"):
        generate_maze(0, 9, start=(1, 1), goal=(1, 1))


@pytest.mark.parametrize("size", SIZES)
def test_solver_is_optimal_against_an_independent_grid_bfs(size: int) -> None:
    for seed in range(15 if size < 51 else 3):
        maze = generate_maze(seed, size)
        actions = solve(maze)
        assert len(actions) == maze.optimal_moves == optimal_moves(maze)
        assert 2 * maze.optimal_moves == _grid_distance(maze, maze.start, maze.goal)
        cell = maze.start
        for action in actions:
            nxt = maze.neighbour(cell, action)
            assert nxt is not None, f"solution walks through a wall at {cell}"
            cell = nxt
        assert cell == maze.goal


def test_optimal_action_from_every_cell_reaches_the_goal_in_the_fewest_moves() -> None:
    maze = generate_maze(7, 11)
    n = maze.num_cells_per_side
    for start in [(r, c) for r in range(n) for c in range(n)]:
        cell, num_moves = start, 0
        while (action := optimal_action(maze, cell)) != "stop":
            d_row, d_col = DIRECTIONS[action]
            assert maze.can_move(cell, action)
            cell, num_moves = (cell[0] + d_row, cell[1] + d_col), num_moves + 1
        assert cell == maze.goal
        assert 2 * num_moves == _grid_distance(maze, start, maze.goal)
        assert len(solve(maze, start)) == num_moves == optimal_moves(maze, start)


def test_on_the_goal_the_optimal_action_is_stop() -> None:
    maze = generate_maze(3, 9)
    assert optimal_action(maze, maze.goal) == "stop"
    assert optimal_direction(maze, maze.goal) is None
    assert solve(maze, require_stop=True) == [*solve(maze), "stop"]
    assert solve(maze, maze.goal) == []


def test_start_and_goal_can_be_placed_anywhere_without_changing_the_layout() -> None:
    default = generate_maze(11, 9)
    moved = generate_maze(11, 9, start=(3, 0), goal=(0, 3))
    assert np.array_equal(default.walls, moved.walls)
    assert moved.start == (3, 0) and moved.goal == (0, 3)
    assert 2 * moved.optimal_moves == _grid_distance(moved, (3, 0), (0, 3))


def test_easy_eval_mazes_need_6_to_14_moves() -> None:
    moves = [generate_maze(spec.seed, 9).optimal_moves for spec in get_eval_set().specs]
    assert min(moves) >= 6 and max(moves) <= 14
    assert len(set(moves)) >= 3, "the eval set should mix difficulties"


@pytest.mark.parametrize(("text", "flag"), [("true", True), (" YES ", True), ("1", True), ("False", False),
                                            ("no", False), (" 0", False), ("maybe", None), ("", None)])
def test_yes_no_options_read_the_same_words_for_every_service(text: str, flag: bool | None) -> None:
    assert option_flag(text) is flag
