"""Sokoban episodes: solving, bumps, invalid actions, a deadlock and the move budget end as documented."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from services.common.task import TaskSpec
from services.env.errors import EnvError
from services.env.sokoban.env import SokobanEnv
from services.env.sokoban.episode import INVALID, SOLVED, STUCK, TASK, WALL_BUMP, SokobanEpisode, Task
from services.env.sokoban.level import Level
from services.env.sokoban.render import SokobanRenderer
from services.env.sokoban.solver import Solution

# 3x3 room, no inner walls: box in the middle, target top-left, agent left of the box.
LEVEL = Level(seed=0, size=3, pulls=1, walls=frozenset(), target=(0, 0), box=(1, 1), agent=(1, 0))


def _episode(max_moves: int = 20) -> SokobanEpisode:
    return SokobanEpisode(Task(LEVEL, Solution.of(LEVEL), SokobanRenderer(LEVEL, 16)), max_moves)


@dataclass
class Action:
    episode_id: str
    action: str


def test_the_oracle_solves_the_level_with_reward_one_on_the_last_push() -> None:
    episode = _episode()
    assert episode.text() == f"{TASK} Moves left: 20."
    for action in ["down", "right", "up", "right", "up"]:
        assert episode.dynamic_info()["optimal_action"] == action
        episode.step(action)
        assert not episode.done and episode.reward == 0.0
    episode.step("<answer>left</answer>")
    assert episode.done and episode.solved and not episode.truncated and episode.reward == 1.0
    assert episode.text() == SOLVED and episode.dynamic_info()["optimal_action"] == ""


def test_a_bump_and_an_invalid_action_cost_a_move_and_change_nothing() -> None:
    episode = _episode()
    episode.step("left")
    assert episode.wall_bump and episode.text() == f"{WALL_BUMP} Moves left: 19."
    episode.step("stop")  # no stop in Sokoban
    assert episode.invalid and episode.text() == f"{INVALID} Moves left: 18."
    assert episode.state == (LEVEL.agent, LEVEL.box) and not episode.done


def test_a_push_into_a_deadlock_ends_the_episode_unsolved_and_not_truncated() -> None:
    episode = _episode()
    episode.step("right")  # the box against the right edge, where no target is
    assert episode.done and episode.stuck and not episode.solved and not episode.truncated
    assert episode.reward == 0.0 and episode.text() == STUCK
    assert episode.dynamic_info()["moves_to_solve"] == -1


def test_the_last_move_of_the_budget_ends_the_episode_truncated() -> None:
    episode = _episode(max_moves=2)
    episode.step("down")
    episode.step("up")
    assert episode.done and episode.truncated and not episode.solved
    assert episode.text() == "No moves left."


def test_every_eval_level_is_solved_by_the_oracle_in_its_optimal_number_of_moves() -> None:
    env = SokobanEnv()
    for spec in env.eval_set().specs:
        (state,) = env.create([spec])
        optimal = state.info["optimal_moves"]
        while not state.done:
            (state,) = env.step([Action(state.episode_id, state.info["optimal_action"])])
        assert state.info["solved"] and state.info["moves"] == optimal <= spec.max_moves


def test_bad_options_are_invalid_argument_naming_the_field() -> None:
    env = SokobanEnv()
    for options, field in (({"size": "2"}, "options.size"), ({"colour": "red"}, "options"),
                           ({"pulls": "x"}, "options.pulls"), ({"unit_px": "400"}, "options.unit_px")):
        with pytest.raises(EnvError, match=field):
            env.create([TaskSpec(seed=1, options=options)])
