"""Moves, wall bumps, invalid actions, rewards and termination of a single episode."""

from __future__ import annotations

import pytest

from services.common.task import TaskSpec
from services.env.config import EnvConfig
from services.env.kit.grid import DIRECTIONS
from services.env.maze.episode import Episode, EpisodeFinishedError
from services.env.maze.maze import Maze, generate_maze, solve
from services.env.maze.render import MazeRenderer
from services.env.maze.spec import parse_spec


def _episode(seed: int = 0, max_moves: int = 20, **options: str) -> Episode:
    settings = parse_spec(TaskSpec(seed=seed, max_moves=max_moves, options=options), EnvConfig())
    maze = generate_maze(settings.seed, settings.size, settings.start, settings.goal)
    return Episode(settings, maze, MazeRenderer(maze, settings.unit_px))


def _blocked_direction(maze: Maze, cell: tuple[int, int]) -> str:
    return next(d for d in DIRECTIONS if not maze.can_move(cell, d))


def test_the_first_observation_states_the_task_and_the_move_budget() -> None:
    episode = _episode()
    assert episode.text() == "Reach the goal. Reply with up, down, left, right or stop. Moves left: 20."
    assert not episode.done and episode.reward == 0.0 and episode.moves == 0
    assert _episode(require_stop="true").text().startswith("Reach the goal, then stop on it.")


def test_wall_bump_costs_a_move_and_keeps_the_frame() -> None:
    episode = _episode()
    frame = episode.frame()
    episode.step(_blocked_direction(episode.maze, episode.position))
    assert episode.position == episode.maze.start
    assert episode.moves == 1 and episode.wall_bump and not episode.invalid
    assert episode.frame() == frame
    assert episode.text() == "You hit a wall. Moves left: 19."
    assert episode.info()["feedback"] == "You hit a wall."


def test_invalid_action_costs_a_move_and_says_so_without_echoing_the_text() -> None:
    episode = _episode()
    frame = episode.frame()
    episode.step("jump over the wall")
    assert episode.moves == 1 and episode.invalid and not episode.wall_bump
    assert episode.frame() == frame
    assert episode.text() == "Invalid action. Moves left: 19."
    assert episode.info()["last_action"] == ""


def test_optimal_play_is_rewarded_exactly_on_reaching_the_goal() -> None:
    episode = _episode(seed=4)
    actions = solve(episode.maze)
    for action in actions[:-1]:
        episode.step(f"<answer>{action}</answer>")
        assert not episode.done and episode.reward == 0.0
        assert episode.text() == f"Moves left: {20 - episode.moves}."
    episode.step(actions[-1])
    assert episode.done and episode.solved and episode.reward == 1.0
    assert episode.text() == "You reached the goal."
    info = episode.info()
    assert info["solved"] and info["moves"] == info["optimal_moves"] == len(actions)


def test_reaching_the_goal_on_the_last_allowed_move_counts() -> None:
    optimal = generate_maze(4, 9).optimal_moves
    episode = _episode(seed=4, max_moves=optimal)
    for action in solve(episode.maze):
        episode.step(action)
    assert episode.done and episode.solved and episode.reward == 1.0


def test_running_out_of_moves_ends_the_episode_unsolved() -> None:
    episode = _episode(seed=4, max_moves=3)
    episode.step(_blocked_direction(episode.maze, episode.position))
    episode.step("xyz")
    assert not episode.done
    episode.step(_blocked_direction(episode.maze, episode.position))
    assert episode.done and not episode.solved and episode.reward == 0.0
    assert episode.text() == "You hit a wall. No moves left."


def test_stop_before_the_goal_ends_the_episode_unsolved_and_costs_a_move() -> None:
    episode = _episode()
    episode.step("stop")
    assert episode.done and not episode.solved and episode.reward == 0.0 and episode.moves == 1
    assert episode.text() == "You stopped before the goal."


def test_stepping_a_finished_episode_raises() -> None:
    episode = _episode()
    episode.step("stop")
    with pytest.raises(EpisodeFinishedError):
        episode.step("up")


def test_require_stop_mode_solves_only_with_stop_on_the_goal() -> None:
    episode = _episode(seed=4, require_stop="true")
    for action in solve(episode.maze):
        episode.step(action)
    assert not episode.done and episode.position == episode.maze.goal and episode.reward == 0.0
    assert episode.text().startswith("You are on the goal.")
    episode.step("stop")
    assert episode.done and episode.solved and episode.reward == 1.0
    assert episode.moves == len(solve(episode.maze)) + 1


def test_require_stop_mode_without_stop_runs_out_of_moves_unsolved() -> None:
    actions = solve(generate_maze(4, 9))
    episode = _episode(seed=4, max_moves=len(actions), require_stop="true")
    for action in actions:
        episode.step(action)
    assert episode.done and not episode.solved and episode.reward == 0.0
    assert episode.text() == "You are on the goal. No moves left."


def test_info_has_every_documented_field() -> None:
    episode = _episode(seed=2, size="11")
    episode.step("down")
    info = episode.info()
    for key in ("solved", "moves", "optimal_moves", "max_moves", "feedback", "last_action", "invalid",
                "wall_bump", "seed", "size"):
        assert key in info
    assert info["seed"] == 2 and info["size"] == 11 and info["max_moves"] == 20
    assert info["last_action"] == "down" and info["moves"] == 1
    assert info["moves_to_goal"] == episode.maze.distance[episode.position]
    before = info["moves_to_goal"]
    episode.step(info["optimal_action"])  # the oracle's move gets one move closer to the goal
    assert episode.info()["moves_to_goal"] == before - 1
