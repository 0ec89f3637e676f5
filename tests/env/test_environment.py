"""MazeEnv, the in-process EnvService: batches, limits, expiry, and refusals that change nothing."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from services.common.task import TaskSpec
from services.env.config import EnvConfig
from services.env.errors import EnvError, ErrorCode
from services.env.maze.env import MazeEnv
from services.env.maze.maze import solve


@dataclass
class Action:
    episode_id: str
    action: str


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _refused(code: ErrorCode, call: object, *args: object) -> str:
    with pytest.raises(EnvError) as raised:
        call(*args)  # type: ignore[operator]
    assert raised.value.code is code, raised.value.message
    return raised.value.message


def test_a_batch_creates_and_steps_many_episodes_with_distinct_uuid_ids() -> None:
    env = MazeEnv()
    created = env.create([TaskSpec(seed=s) for s in range(8)])
    ids = [episode.episode_id for episode in created]
    assert len(set(ids)) == 8 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert all(not e.done and e.reward == 0.0 and e.frame_png.startswith(b"\x89PNG") for e in created)
    stepped = env.step([Action(i, "down") for i in ids])
    assert [e.episode_id for e in stepped] == ids
    assert all(e.info["moves"] == 1 for e in stepped)


def test_episodes_of_the_same_task_share_one_maze() -> None:
    env = MazeEnv()
    first, second, other = env.create([TaskSpec(seed=1), TaskSpec(seed=1), TaskSpec(seed=2)])
    a, b, c = (env.store.get(e.episode_id) for e in (first, second, other))
    assert a is not None and b is not None and c is not None
    assert a.maze is b.maze and a.maze is not c.maze
    assert first.frame_png == second.frame_png


def test_a_refused_step_batch_changes_no_episode() -> None:
    env = MazeEnv()
    good, done = (e.episode_id for e in env.create([TaskSpec(seed=0), TaskSpec(seed=0)]))
    env.step([Action(done, "stop")])
    _refused(ErrorCode.FAILED_PRECONDITION, env.step, [Action(good, "down"), Action(done, "up")])
    _refused(ErrorCode.NOT_FOUND, env.step, [Action(good, "down"), Action("nope", "up")])
    _refused(ErrorCode.INVALID_ARGUMENT, env.step, [Action(good, "down"), Action(good, "down")])
    episode = env.store.get(good)
    assert episode is not None and episode.moves == 0


def test_step_messages_name_the_action_and_the_reason() -> None:
    env = MazeEnv(EnvConfig(max_action_chars=10))
    (first,) = (e.episode_id for e in env.create([TaskSpec(seed=0)]))
    message = _refused(ErrorCode.INVALID_ARGUMENT, env.step, [Action(first, "x" * 11)])
    assert message == "actions[0].action: 11 characters, more than max_action_chars=10"
    message = _refused(ErrorCode.NOT_FOUND, env.step, [Action(first, "up"), Action("abc", "up")])
    assert message == "actions[1].episode_id: unknown episode 'abc'"
    env.step([Action(first, "stop")])
    message = _refused(ErrorCode.FAILED_PRECONDITION, env.step, [Action(first, "up")])
    assert message == f"actions[0].episode_id: episode {first!r} is done; create a new one"
    assert env.close([first]) == 1
    message = _refused(ErrorCode.NOT_FOUND, env.step, [Action(first, "up")])
    assert message == f"actions[0].episode_id: episode {first!r} was closed"


def test_batches_larger_than_max_batch_are_refused() -> None:
    env = MazeEnv(EnvConfig(max_batch=2))
    specs = [TaskSpec(seed=0)] * 3
    assert _refused(ErrorCode.INVALID_ARGUMENT, env.create, specs) == "specs: 3 items, more than max_batch=2"
    assert _refused(ErrorCode.INVALID_ARGUMENT, env.close, ["a", "b", "c"]).startswith("episode_ids: 3 items")
    assert len(env.store) == 0


def test_the_live_episode_limit_refuses_a_whole_batch_until_episodes_are_closed() -> None:
    env = MazeEnv(EnvConfig(max_live_episodes=3))
    ids = [e.episode_id for e in env.create([TaskSpec(seed=0)] * 2)]
    message = _refused(ErrorCode.RESOURCE_EXHAUSTED, env.create, [TaskSpec(seed=0)] * 2)
    assert "max_live_episodes=3" in message and len(env.store) == 2
    env.close(ids)
    assert len(env.create([TaskSpec(seed=0)] * 3)) == 3


def test_idle_episodes_expire_and_then_are_not_found() -> None:
    clock = FakeClock()
    env = MazeEnv(EnvConfig(idle_ttl_s=60, max_live_episodes=2), clock=clock)
    idle, busy = (e.episode_id for e in env.create([TaskSpec(seed=0), TaskSpec(seed=1)]))
    clock.now += 40
    env.step([Action(busy, "down")])
    clock.now += 40  # idle: 80 s without use; busy: 40 s
    message = _refused(ErrorCode.NOT_FOUND, env.step, [Action(idle, "down")])
    assert message == f"actions[0].episode_id: episode {idle!r} expired (idle for more than 60 s)"
    env.step([Action(busy, "down")])
    assert len(env.create([TaskSpec(seed=2)])) == 1, "the expired episode freed its slot"
    assert env.store.num_expired == 1


def test_close_ignores_unknown_ids_and_counts_the_live_ones() -> None:
    env = MazeEnv()
    ids = [e.episode_id for e in env.create([TaskSpec(seed=0)] * 2)]
    assert env.close([ids[0], "unknown", ids[0]]) == 1
    assert env.close(ids) == 1
    assert len(env.store) == 0


def test_garbage_action_text_is_a_move_not_an_error() -> None:
    env = MazeEnv()
    (episode_id,) = (e.episode_id for e in env.create([TaskSpec(seed=0)]))
    (state,) = env.step([Action(episode_id, "\x00\ufffd🙂 <answer>")])
    assert state.info["invalid"] and state.info["moves"] == 1 and not state.done


def test_a_whole_optimal_episode_through_the_batched_api() -> None:
    env = MazeEnv()
    (created,) = env.create([TaskSpec(seed=12, max_moves=30, options={"size": "11"})])
    episode = env.store.get(created.episode_id)
    assert episode is not None
    for action in solve(episode.maze):
        (state,) = env.step([Action(created.episode_id, action)])
    assert state.done and state.reward == 1.0 and state.info["solved"]
    assert state.info["moves"] == state.info["optimal_moves"]


def test_unknown_eval_set_is_not_found() -> None:
    env = MazeEnv()
    assert env.eval_set("").name == "maze-easy-64"
    assert "unknown eval set 'nope'" in _refused(ErrorCode.NOT_FOUND, env.eval_set, "nope")
