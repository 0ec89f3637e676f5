"""Gymnasium environments served over EnvService: the presets pass every check of `mmrl env check`, a
spec always plays the same episode, the action words come from the env, and a task that ends on its
budget's last move is terminated, not truncated."""

from __future__ import annotations

from collections import deque

import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("minigrid")

from mmrl.cli.main import main as mmrl  # noqa: E402
from services.common.task import TaskSpec  # noqa: E402
from services.env.gym.env import GymnasiumEnv  # noqa: E402
from services.env.gym.presets import PRESETS, frozen_lake_map, resolve  # noqa: E402
from services.env.servicer import EnvServicer  # noqa: E402


@pytest.mark.parametrize("preset", sorted(PRESETS))
async def test_a_preset_passes_every_check(preset: str) -> None:
    from mmrl.envcheck.runner import CHECK_NAMES, run_checks, table
    from tests.envcheck.test_env_check import serving

    async with serving(EnvServicer(GymnasiumEnv(resolve(preset)))) as address:
        results = await run_checks(address, timeout_s=30)  # a 64-task eval set is made on a loaded machine too
    assert [r.name for r in results] == CHECK_NAMES
    assert all(r.passed for r in results), table(results)


def test_the_action_words_are_the_envs_own_names_or_the_ones_given() -> None:
    assert GymnasiumEnv(resolve("FrozenLake-v1")).info().actions == ("left", "down", "right", "up")
    assert GymnasiumEnv(resolve("MiniGrid-Empty-5x5-v0")).info().actions == (
        "left", "right", "forward", "pickup", "drop", "toggle", "done")
    assert GymnasiumEnv(resolve("minigrid-empty-6x6")).info().actions == ("left", "right", "forward")
    renamed = GymnasiumEnv(resolve("CartPole-v1", action_words="push_left,push_right"))
    assert renamed.info().actions == ("push_left", "push_right")
    with pytest.raises(ValueError, match="names no actions"):
        GymnasiumEnv(resolve("CartPole-v1"))


def test_a_spec_plays_the_same_episode_and_another_seed_another_map() -> None:
    env = GymnasiumEnv(resolve("frozenlake-4x4"))
    a, b, other = env.create([TaskSpec(5), TaskSpec(5), TaskSpec(6)])
    assert a.frame_png == b.frame_png != other.frame_png
    moves = ["right", "down", "Down.", "<answer>right</answer>"]
    for move in moves:
        a, b = env.step([_act(a.episode_id, move), _act(b.episode_id, move)])
        assert (a.frame_png, a.reward, a.done, a.text) == (b.frame_png, b.reward, b.done, b.text)
        if a.done:
            break


def _act(episode_id: str, action: str) -> object:
    from mmrl_proto.v1 import env_pb2

    return env_pb2.EpisodeAction(episode_id=episode_id, action=action)


def _shortest_path(desc: list[str]) -> list[str]:
    """The moves of a shortest safe path from S to G of a FrozenLake map (breadth-first)."""
    size, moves = len(desc), {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
    queue, came = deque([(0, 0)]), {(0, 0): ((0, 0), "")}
    while queue:
        cell = queue.popleft()
        if desc[cell[0]][cell[1]] == "G":
            path = []
            while cell != (0, 0):
                cell, move = came[cell]
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in moves.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in came and desc[nxt[0]][nxt[1]] != "H":
                came[nxt] = (cell, move)
                queue.append(nxt)
    raise AssertionError("no path")


def test_reaching_the_goal_on_the_last_move_of_the_budget_is_terminated_not_truncated() -> None:
    env = GymnasiumEnv(resolve("frozenlake-4x4"))
    path = _shortest_path(frozen_lake_map(11)["desc"])
    (state,) = env.create([TaskSpec(11, max_moves=len(path))])
    for move in path:
        (state,) = env.step([_act(state.episode_id, move)])
    assert state.done and not state.truncated and state.reward == 1.0 and state.info["solved"]
    (short,) = env.create([TaskSpec(11, max_moves=len(path) - 1)])
    for move in path[:-1]:
        (short,) = env.step([_act(short.episode_id, move)])
    assert short.done and short.truncated and not short.info["solved"]


def test_an_unreadable_action_costs_a_move_and_says_so() -> None:
    env = GymnasiumEnv(resolve("minigrid-empty-6x6"))
    (state,) = env.create([TaskSpec(3)])
    assert state.text == "get to the green goal square. direction 0. Moves left: 12."
    (after,) = env.step([_act(state.episode_id, "jump")])
    assert after.info["invalid"] and after.text == "Invalid action. direction 0. Moves left: 11."  # the mission once
    assert after.frame_png == state.frame_png


def test_serving_an_unknown_gymnasium_id_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert mmrl(["serve", "env", "--gymnasium", "NoSuchEnv-v0", "--port", "0"]) == 2
    assert "--gymnasium NoSuchEnv-v0" in capsys.readouterr().err
