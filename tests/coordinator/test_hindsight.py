"""Hindsight relabelling (services/coordinator/hindsight.py): which way a failed episode is relabelled
with, how relabellings are chosen, and the replay on a real env service (grpc.aio on loopback)."""

from __future__ import annotations

import pytest

from services.common.conversation import TokenConversation, expand_image_placeholders
from services.common.maze import DIRECTIONS, generate_maze, solve
from services.common.trajectory import Trajectory
from services.coordinator import hindsight, trajectories
from services.coordinator.clients import Services
from services.coordinator.config import Replayed
from services.coordinator.episodes import EpisodeResult, Timers, observation_key
from services.coordinator.wire import TaskSpec
from tests.coordinator.chat import CHAT, CharTokenizer

TOKENS_PER_IMAGE = 3
OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}


def _keyed(keys: list[str], final: str, *, solved: bool = False, position: tuple[int, int] = (1, 1),
           seed: int = 1, actions: list[str] | None = None) -> EpisodeResult:
    """An episode that acted from observations `keys` and ended on `final`."""
    return EpisodeResult(spec=TaskSpec(seed=seed, max_moves=20), group_index=0,
                         conversation=TokenConversation(CHAT), actions=actions or ["up"] * len(keys),
                         reward=float(solved), info={"solved": solved, "position": list(position)},
                         observation_keys=keys, final_observation_key=final)


def test_relabel_keeps_the_loop_erased_way_to_where_the_episode_ended() -> None:
    # S -> A -> B -> A (back) -> B -> B (a wall bump) -> C: the way to C is S->A (turn 0), A->B (turn 3),
    # B->C (turn 5).
    found = hindsight.relabel(_keyed(["S", "A", "B", "A", "B", "B"], "C", position=(2, 1)))
    assert found is not None
    assert found.turns == (0, 3, 5) and found.options == {"goal": "2,1"}


def test_relabel_cuts_the_loop_back_to_a_cell_already_on_the_way() -> None:
    # S -> A -> B -> A: it ended on A, one move from the start.
    found = hindsight.relabel(_keyed(["S", "A", "B"], "A"))
    assert found is not None and found.turns == (0,)


def test_relabel_keeps_the_episodes_own_options() -> None:
    episode = _keyed(["S", "A"], "B", position=(0, 2))
    episode.spec.options["start"] = "0,0"
    found = hindsight.relabel(episode)
    assert found is not None and found.options == {"start": "0,0", "goal": "0,2"}


def test_a_solved_episode_with_detours_keeps_its_goal_and_loses_the_detours() -> None:
    episode = _keyed(["S", "A", "B", "A", "A"], "G", solved=True)
    episode.spec.options["start"] = "0,0"
    found = hindsight.relabel(episode)
    assert found is not None
    # S->A (turn 0), A->B and back (turns 1-2) and a bump (turn 3) cut out, A->G (turn 4).
    assert found.turns == (0, 4) and found.options == {"start": "0,0"}


@pytest.mark.parametrize("episode", [
    _keyed(["S", "A"], "B", solved=True),     # solved the straight way: its replay is itself
    _keyed(["S", "A", "B"], "S"),             # back where it started
    _keyed(["S", "S"], "S"),                  # bumped into walls only
])
def test_relabel_refuses_episodes_with_no_way_to_learn(episode: EpisodeResult) -> None:
    assert hindsight.relabel(episode) is None


@pytest.mark.parametrize(("replayed", "expected"), [
    ("failed", [2]), ("solved", [1]), ("both", [1, 2]),
])
def test_select_takes_the_episodes_asked_for(replayed: Replayed, expected: list[int]) -> None:
    solved = _keyed(["S", "A", "A"], "G", solved=True, seed=1)
    failed = _keyed(["S", "A"], "B", seed=2)
    chosen = hindsight.select([[solved], [failed]], limit=10, replayed=replayed)
    assert [r.episode.spec.seed for r in chosen] == expected
    with pytest.raises(ValueError, match="'failed', 'solved' or 'both'"):
        hindsight.select([[solved]], limit=10, replayed="all")  # type: ignore[arg-type]


def test_an_episode_cut_at_the_turn_limit_ends_on_its_last_observation() -> None:
    episode = _keyed(["S", "A", "B"], "")
    episode.actions = episode.actions[:2]
    found = hindsight.relabel(episode)
    assert found is not None and found.turns == (0, 1)


def test_select_spreads_over_groups_skips_duplicates_and_keeps_the_limit() -> None:
    def group(seed: int, ways: list[list[str]]) -> list[EpisodeResult]:
        return [_keyed(["S", "A"], "B", seed=seed, actions=way) for way in ways]

    groups = [group(1, [["up", "up"], ["up", "up"], ["up", "left"]]), group(2, [["down", "down"]])]
    chosen = hindsight.select(groups, limit=10)
    # Round-robin: group 1's first, group 2's first, then group 1's third (its second repeats its first).
    assert [(r.episode.spec.seed, r.episode.actions) for r in chosen] == [
        (1, ["up", "up"]), (2, ["down", "down"]), (1, ["up", "left"])]
    assert len(hindsight.select(groups, limit=2)) == 2


def test_interleave_spreads_the_extra_trajectories_over_the_minibatches() -> None:
    def traj(name: str) -> Trajectory:
        return Trajectory(trajectory_id=name, token_ids=(1,), loss_mask=(1,), logprobs=(0.0,), advantages=(1.0,))

    main = [traj(f"m{i}") for i in range(8)]
    extra = [traj(f"h{i}") for i in range(4)]
    merged = [t.trajectory_id for t in trajectories.interleave(main, extra)]
    assert [n for n in merged if n.startswith("m")] == [f"m{i}" for i in range(8)]
    assert [n for n in merged if n.startswith("h")] == [f"h{i}" for i in range(4)]
    # Four contiguous mini-batches of three: one relabelled episode in each.
    assert [sum(n.startswith("h") for n in merged[k:k + 3]) for k in range(0, 12, 3)] == [1, 1, 1, 1]
    assert trajectories.interleave(main, []) == main


async def _play(services: Services, spec: TaskSpec, actions: list[str]) -> EpisodeResult:
    """Plays `actions` on the env service as the coordinator does, a stand-in engine generating each
    action's characters and <|im_end|>."""
    tokenizer = CharTokenizer()
    (state,) = await services.env.create_episodes([spec])
    conv = TokenConversation(CHAT)
    frames = state.images
    conv.add_observation(tokenizer, state.text, frames)
    episode = EpisodeResult(spec=spec, group_index=0, conversation=conv, observation_keys=[observation_key(frames)])
    for action in actions:
        expanded = expand_image_placeholders(conv.compact_ids, CHAT.image_pad, [TOKENS_PER_IMAGE] * len(conv.images))
        conv.add_generation(expanded, [*tokenizer.encode(action), CHAT.im_end], [-0.1] * (len(action) + 1))
        episode.actions.append(action)
        (state,) = await services.env.step([(state.episode_id, action)])
        episode.reward = state.reward
        episode.info = {"solved": state.info["solved"], "position": list(state.info["position"])}
        frames = state.images
        if state.done:
            episode.final_observation_key = observation_key(frames)
            break
        conv.add_observation(tokenizer, state.text, frames)
        episode.observation_keys.append(observation_key(frames))
    return episode


async def test_replay_plays_the_way_again_with_the_end_as_the_goal(env_services: Services) -> None:
    maze = generate_maze(3, 9)
    way = solve(maze)
    assert len(way) >= 6
    first, second, third = way[:3]
    here = maze.neighbour(maze.neighbour(maze.start, first), second)  # type: ignore[arg-type]
    bump = next(d for d in DIRECTIONS if not maze.can_move(here, d))  # type: ignore[arg-type]
    # Two optimal moves, back and forth, a wall bump, the third optimal move: out of moves, unsolved.
    actions = [first, second, OPPOSITE[second], second, bump, third]
    episode = await _play(env_services, TaskSpec(seed=3, max_moves=6), actions)
    assert episode.info["solved"] is False and episode.final_observation_key

    found = hindsight.relabel(episode)
    assert found is not None and found.turns == (0, 3, 5)
    end = maze.neighbour(here, third)  # type: ignore[arg-type]
    assert found.options == {"goal": f"{end[0]},{end[1]}"}  # type: ignore[index]

    timers = Timers()
    convs = await hindsight.replay(env_services, CharTokenizer(), CHAT, [found], system_prompt="", timers=timers)
    assert len(convs) == 1 and timers.seconds["hindsight"] > 0
    conv = convs[0]
    assert conv.num_turns == 3 and len(conv.images) == 3
    generated = [[t for t, m in zip(conv.record_ids[s:], conv.loss_mask[s:], strict=True) if m][: len(a) + 1]
                 for s, a in zip(conv.turn_starts, (first, second, third), strict=True)]
    assert generated == [[*CharTokenizer().encode(a), CHAT.im_end] for a in (first, second, third)]
    assert conv.record_ids.count(CHAT.image_pad) == 3 * TOKENS_PER_IMAGE
    # The frames are the environment's with the goal where the episode ended.
    (created,) = await env_services.env.create_episodes([TaskSpec(seed=3, max_moves=6, options=found.options)])
    assert conv.images[0] == created.images[0]
    assert conv.images[0] != episode.conversation.images[0]

    (traj,) = hindsight.to_trajectories(convs, 1.5, step=7, adapter_version=2)
    traj.validate()
    assert traj.reward == 1.0 and traj.group_id == "s7-hindsight" and set(traj.logprobs) == {0.0}
    assert {a for a, m in zip(traj.advantages, traj.loss_mask, strict=True) if m} == {1.5}
    assert {a for a, m in zip(traj.advantages, traj.loss_mask, strict=True) if not m} == {0.0}


async def test_a_replay_that_does_not_reach_its_goal_is_left_out(env_services: Services) -> None:
    maze = generate_maze(3, 9)
    way = solve(maze)
    episode = await _play(env_services, TaskSpec(seed=3, max_moves=3), way[:3])
    found = hindsight.relabel(episode)
    assert found is not None and found.turns == (0, 1, 2)
    short = hindsight.Relabel(episode=found.episode, options=found.options, turns=found.turns[:2])
    convs = await hindsight.replay(env_services, CharTokenizer(), CHAT, [short, found], system_prompt="",
                                   timers=Timers())
    assert [c.num_turns for c in convs] == [3]


async def test_a_solved_episode_is_replayed_to_its_own_goal_without_its_detour(env_services: Services) -> None:
    maze = generate_maze(3, 9)
    way = solve(maze)
    here = maze.neighbour(maze.start, way[0])
    bump = next(d for d in DIRECTIONS if not maze.can_move(here, d))  # type: ignore[arg-type]
    # The first move, a wall bump, the second move and back, then the whole way: solved.
    actions = [way[0], bump, way[1], OPPOSITE[way[1]], *way[1:]]
    episode = await _play(env_services, TaskSpec(seed=3, max_moves=20), actions)
    assert episode.info["solved"] is True

    found = hindsight.relabel(episode)
    assert found is not None and found.options == {}
    assert [episode.actions[t] for t in found.turns] == way
    convs = await hindsight.replay(env_services, CharTokenizer(), CHAT, [found], system_prompt="", timers=Timers())
    assert len(convs) == 1 and convs[0].num_turns == len(way)
    # The same frames as the episode's own where the two agree: the start, and the goal drawn in its place.
    assert convs[0].images[0] == episode.conversation.images[0]
    assert convs[0].images[1] == episode.conversation.images[1]
