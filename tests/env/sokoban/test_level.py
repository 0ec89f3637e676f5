"""Sokoban levels: deterministic, solvable by construction, and the oracle solves them optimally."""

from __future__ import annotations

import pytest

from services.env.sokoban.level import Level, generate_level, reachable
from services.env.sokoban.solver import Solution, move


def _floor(level: Level) -> frozenset[tuple[int, int]]:
    return frozenset((r, c) for r in range(level.size) for c in range(level.size)) - level.walls


def test_the_same_seed_gives_the_same_level_and_other_seeds_other_levels() -> None:
    assert generate_level(7) == generate_level(7)
    assert generate_level(7).layout_text() == generate_level(7, 5, 4).layout_text()
    layouts = {generate_level(seed).layout_text() for seed in range(100)}
    assert len(layouts) >= 95


def test_the_first_level_is_pinned() -> None:
    # Generation is part of the eval sets' content hash: this catches a change early and legibly.
    assert generate_level(1).layout_text() == "T...#\n.B.A.\n.....\n#....\n....."


@pytest.mark.parametrize("size", [3, 5, 6, 8])
def test_every_level_is_connected_and_solvable_with_the_box_off_the_target(size: int) -> None:
    for seed in range(150):
        level = generate_level(seed, size)
        floor = _floor(level)
        assert {level.box, level.agent, level.target} <= floor
        assert level.box != level.target and level.agent != level.box
        assert len(reachable(floor, next(iter(floor)), (-1, -1))) == len(floor)
        assert Solution.of(level).optimal_moves >= 1


def test_the_oracle_plays_every_level_to_the_target_in_its_optimal_number_of_moves() -> None:
    for seed in range(300):
        level = generate_level(seed)
        solution = Solution.of(level)
        state = (level.agent, level.box)
        actions = solution.solve()
        for action in actions:
            state, outcome = move(level, state, action)
            assert outcome != "bump"
        assert state[1] == level.target
        assert len(actions) == solution.optimal_moves


def test_bad_arguments_are_refused() -> None:
    for kwargs in ({"size": 2}, {"size": 13}, {"pulls": 0}):
        with pytest.raises(ValueError):
            generate_level(0, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed"):
        generate_level(-1)


def test_a_push_into_a_wall_is_a_bump_and_a_push_into_a_dead_corner_has_no_solution() -> None:
    level = Level(seed=0, size=3, pulls=1, walls=frozenset(), target=(0, 0), box=(1, 1), agent=(1, 0))
    solution = Solution.of(level)
    # down, right, up (the box to (0, 1)), right, up, left (the box onto the target)
    assert solution.optimal_moves == 6 and solution.solve() == ["down", "right", "up", "right", "up", "left"]
    state, outcome = move(level, (level.agent, level.box), "right")
    assert outcome == "push" and state == ((1, 1), (1, 2))
    assert solution.moves_to_solve(state) is None and solution.optimal_action(state) is None
    assert move(level, state, "right") == (state, "bump")  # the box against the room's edge
    assert move(level, ((0, 0), (1, 1)), "up") == (((0, 0), (1, 1)), "bump")  # the agent against it
