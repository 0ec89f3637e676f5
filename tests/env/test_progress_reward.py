"""The `reward: progress` option of the maze and Sokoban: every move earns the share of the way to the
solution it covered (potential-based shaping from the env's oracle), so an episode's rewards sum to 1
plus the share covered, a move there and back earns nothing, and a stuck box costs the whole way.
`reward: paced` charges every turn one move's share besides: a shortest solve earns 1.0 in all."""

from __future__ import annotations

import pytest

from services.common.task import TaskSpec
from services.env.errors import EnvError
from services.env.kit.reward import progress, shaping
from services.env.maze.env import MazeEnv
from services.env.maze.maze import generate_maze, solve
from services.env.sokoban.env import SokobanEnv, load_task


def _play(env: object, spec: TaskSpec, actions: list[str]) -> list[tuple[float, bool]]:
    [state] = env.create([spec])  # type: ignore[attr-defined]
    out = []
    for action in actions:
        [state] = env.step([type("A", (), {"episode_id": state.episode_id, "action": action})()])  # type: ignore[attr-defined]
        out.append((state.reward, state.done))
    return out


def test_the_shaping_of_a_turn_is_the_share_of_the_way_it_covered() -> None:
    assert progress(5, 4, 10) == pytest.approx(0.1) and progress(4, 5, 10) == pytest.approx(-0.1)
    assert progress(3, None, 6) == pytest.approx((3 - 12) / 6)  # unsolvable: twice the start's distance
    assert progress(0, 0, 0) == 0.0


def test_the_oracles_way_through_a_maze_earns_one_for_the_solve_and_one_for_the_way() -> None:
    maze = generate_maze(11, 9)
    spec = TaskSpec(seed=11, max_moves=20, options={"size": "9", "reward": "progress"})
    played = _play(MazeEnv(), spec, solve(maze))
    assert sum(r for r, _ in played) == pytest.approx(2.0) and played[-1][1]
    assert all(r == pytest.approx(1 / maze.optimal_moves) for r, _ in played[:-1])
    sparse = _play(MazeEnv(), TaskSpec(seed=11, max_moves=20, options={"size": "9"}), solve(maze))
    assert [r for r, _ in sparse] == [0.0] * (len(played) - 1) + [1.0]


def test_a_move_there_and_back_or_into_a_wall_earns_nothing() -> None:
    maze = generate_maze(11, 9)
    first = solve(maze)[0]
    back = {"up": "down", "down": "up", "left": "right", "right": "left"}[first]
    blocked = next(d for d in ("up", "down", "left", "right") if maze.neighbour(maze.start, d) is None)
    spec = TaskSpec(seed=11, max_moves=20, options={"size": "9", "reward": "progress"})
    rewards = [r for r, _ in _play(MazeEnv(), spec, [first, back, blocked, "jump"])]
    assert rewards[0] == pytest.approx(-rewards[1]) and rewards[0] > 0 and rewards[2:] == [0.0, 0.0]


def test_sokoban_solved_earns_two_and_a_stuck_box_costs_the_whole_way() -> None:
    env = SokobanEnv()
    spec = TaskSpec(seed=3, max_moves=20, options={"size": "5", "pulls": "4", "reward": "progress"})
    [state] = env.create([spec])
    task = load_task(3, 5, 4, 16, True, 1 << 20)
    total, done = 0.0, False
    while not done:
        [state] = env.step([type("A", (), {"episode_id": state.episode_id,
                                           "action": state.dynamic_info["optimal_action"]})()])
        total, done = total + state.reward, state.done
    assert total == pytest.approx(2.0) and state.dynamic_info["solved"]
    stuck = _stuck_walk(env, task)
    assert stuck is not None and sum(stuck) == pytest.approx(-1.0)


def _stuck_walk(env: SokobanEnv, task: object) -> list[float] | None:
    """Plays random moves on seeds until a push leaves the box stuck; the shaping of that episode."""
    import random

    rng = random.Random(0)
    for seed in range(40):
        spec = TaskSpec(seed=seed, max_moves=40, options={"size": "5", "pulls": "4", "reward": "progress"})
        [state] = env.create([spec])
        rewards = []
        while not state.done:
            [state] = env.step([type("A", (), {"episode_id": state.episode_id,
                                               "action": rng.choice(["up", "down", "left", "right"])})()])
            rewards.append(state.reward)
        if state.dynamic_info["stuck"]:
            return rewards
    return None


@pytest.mark.parametrize("env", [MazeEnv(), SokobanEnv()])
def test_an_unknown_reward_mode_is_refused_naming_the_option(env: object) -> None:
    with pytest.raises(EnvError, match=r"options\.reward: must be one of sparse, progress, paced"):
        env.create([TaskSpec(seed=1, max_moves=5, options={"reward": "dense"})])  # type: ignore[attr-defined]


def test_paced_shaping_charges_each_turn_one_moves_share() -> None:
    assert shaping("paced", 5, 4, 10) == pytest.approx(0.0)  # along a shortest solution: breaks even
    assert shaping("paced", 5, 5, 10) == pytest.approx(-0.1) and shaping("paced", 4, 5, 10) == pytest.approx(-0.2)
    assert shaping("progress", 5, 5, 10) == 0.0 and shaping("sparse", 5, 4, 10) == 0.0


def test_paced_maze_a_shortest_solve_earns_one_and_a_bump_costs_a_move() -> None:
    maze = generate_maze(11, 9)
    spec = TaskSpec(seed=11, max_moves=20, options={"size": "9", "reward": "paced"})
    played = _play(MazeEnv(), spec, solve(maze))
    assert sum(r for r, _ in played) == pytest.approx(1.0) and played[-1][1]
    blocked = next(d for d in ("up", "down", "left", "right") if maze.neighbour(maze.start, d) is None)
    [(bump, _)] = _play(MazeEnv(), spec, [blocked])
    assert bump == pytest.approx(-1 / maze.optimal_moves)


def test_paced_sokoban_each_move_beyond_the_fewest_costs_its_share() -> None:
    env = SokobanEnv()
    spec = TaskSpec(seed=3, max_moves=20, options={"size": "5", "pulls": "4", "reward": "paced"})
    optimal = load_task(3, 5, 4, 16, True, 1 << 20).solution.optimal_moves
    [state] = env.create([spec])
    total, turns = 0.0, 0
    bump = next(a for a in ("up", "down", "left", "right") if _bumps(env, spec, a))
    for action in [bump, bump]:
        [state] = env.step([type("A", (), {"episode_id": state.episode_id, "action": action})()])
        total, turns = total + state.reward, turns + 1
    while not state.done:
        [state] = env.step([type("A", (), {"episode_id": state.episode_id,
                                           "action": state.dynamic_info["optimal_action"]})()])
        total, turns = total + state.reward, turns + 1
    assert state.dynamic_info["solved"] and turns == optimal + 2
    assert total == pytest.approx(1.0 - 2 / optimal)  # the solve's 1.0, less the two wasted turns


def _bumps(env: SokobanEnv, spec: TaskSpec, action: str) -> bool:
    [state] = env.create([spec])
    [state] = env.step([type("A", (), {"episode_id": state.episode_id, "action": action})()])
    return bool(state.dynamic_info.get("wall_bump"))
