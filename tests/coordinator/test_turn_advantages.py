"""Advantages of a group of played episodes, per turn and per token (`trajectories.turn_advantages`,
`trajectories.to_trajectories`): episode-level GRPO alone, with GiGPO's step-level term, with the no-op
and invalid-action penalties and with credit on the loop-erased path only."""

from __future__ import annotations

import pytest

from services.common.conversation import TokenConversation
from services.coordinator import trajectories
from services.coordinator.episodes import EpisodeResult, invalid_fraction, observation_key
from services.coordinator.wire import TaskSpec
from tests.coordinator.chat import CHAT


def _episode(states: list[bytes], reward: float, invalid: list[bool] | None = None) -> EpisodeResult:
    """An episode that acted once from each frame in `states` (one generated token per turn);
    `invalid` flags the turns whose action the env could not read (none by default)."""
    conv = TokenConversation(CHAT)
    for frame in states:
        conv.compact_ids += [1, 7, 3, 4, 5, 2, 6, 1, 8]
        conv.images.append(frame)
        conv.add_generation(conv.record_ids + conv.compact_ids[len(conv.record_ids):], [10], [-0.5])
    return EpisodeResult(spec=TaskSpec(seed=1), group_index=0, conversation=conv,
                         actions=["up"] * len(states), reward=reward,
                         observation_keys=[observation_key([f]) for f in states],
                         invalid_turns=invalid if invalid is not None else [False] * len(states))


def test_observation_keys_tell_images_apart() -> None:
    assert observation_key([b"ab"]) == observation_key([b"ab"])
    assert observation_key([b"ab"]) != observation_key([b"a", b"b"]) != observation_key([b"ba"])


def test_without_a_step_weight_every_turn_carries_the_episode_advantage() -> None:
    group = [_episode([b"A", b"B"], 1.0), _episode([b"A", b"C", b"D"], 0.0)]
    solved, failed = trajectories.turn_advantages(group, "std")
    assert solved == pytest.approx([1.0, 1.0], rel=1e-5) and failed == pytest.approx([-1.0] * 3, rel=1e-5)


def test_the_step_term_ranks_actions_taken_from_the_same_state() -> None:
    # Both solve; the second bumps a wall first (its frame A repeats), so it is one move slower.
    group = [_episode([b"A", b"B"], 1.0), _episode([b"A", b"A", b"B"], 1.0)]
    plain = trajectories.turn_advantages(group, "none", discount=0.5)
    assert plain == [[0.125, 0.125], [-0.125, -0.125, -0.125]]  # returns 0.5 and 0.25
    gigpo = trajectories.turn_advantages(group, "none", discount=0.5, step_weight=1.0)
    a = 5 / 12  # mean return from state A: (0.5 + 0.25 + 0.5) / 3
    assert gigpo[0] == pytest.approx([0.125 + 0.5 - a, 0.125])
    assert gigpo[1] == pytest.approx([-0.125 + 0.25 - a, -0.125 + 0.5 - a, -0.125])


def test_trajectories_carry_each_turns_advantage_on_its_generated_tokens() -> None:
    group = [_episode([b"A", b"B"], 1.0), _episode([b"A", b"A", b"B"], 1.0)]
    built = trajectories.to_trajectories([group], "none", step=3, discount=0.5, step_weight=1.0)
    expected = trajectories.turn_advantages(group, "none", discount=0.5, step_weight=1.0)
    for trajectory, turns in zip(built, expected, strict=True):
        generated = [a for a, m in zip(trajectory.advantages, trajectory.loss_mask, strict=True) if m]
        assert generated == pytest.approx(turns)
        assert all(a == 0.0 for a, m in zip(trajectory.advantages, trajectory.loss_mask, strict=True) if not m)


def test_noop_turns_are_the_turns_after_which_the_observation_repeats() -> None:
    keys = ["A", "A", "B", "B", "C"]
    assert trajectories.noop_turns(keys, 5) == [True, False, True, False, False]  # ended: no next observation
    assert trajectories.noop_turns(keys, 4) == [True, False, True, False]  # cut at the turn limit
    with pytest.raises(ValueError, match="observations for"):
        trajectories.noop_turns(keys, 3)


def test_the_noop_penalty_lowers_only_the_turns_that_changed_nothing() -> None:
    # Both fail (no episode-level signal); the second bumps a wall twice from frame A.
    group = [_episode([b"A", b"B"], 0.0), _episode([b"A", b"A", b"A", b"B"], 0.0)]
    assert trajectories.turn_advantages(group, "std") == [[0.0, 0.0], [0.0] * 4]
    clean, bumped = trajectories.turn_advantages(group, "std", noop_penalty=0.5)
    assert clean == [0.0, 0.0] and bumped == [-0.5, -0.5, 0.0, 0.0]
    solved = [_episode([b"A", b"A", b"B"], 1.0), _episode([b"A", b"C"], 0.0)]
    assert trajectories.turn_advantages(solved, "none", noop_penalty=1.0) == [[-0.5, 0.5, 0.5], [-0.5, -0.5]]


def test_the_invalid_penalty_lowers_only_the_turns_the_env_could_not_read() -> None:
    # The first solves after an unreadable first action; the second fails cleanly.
    group = [_episode([b"A", b"A", b"B"], 1.0, invalid=[True, False, False]), _episode([b"A", b"C"], 0.0)]
    assert trajectories.turn_advantages(group, "none") == [[0.5] * 3, [-0.5] * 2]
    assert trajectories.turn_advantages(group, "none", invalid_penalty=1.0) == [[-0.5, 0.5, 0.5], [-0.5, -0.5]]
    # Both penalties: a bump (frame A again) that was also unreadable pays both.
    both = trajectories.turn_advantages(group, "none", noop_penalty=0.25, invalid_penalty=1.0)
    assert both == [[-0.75, 0.5, 0.5], [-0.5, -0.5]]
    assert invalid_fraction(group) == pytest.approx(1 / 5)


def test_noop_fraction_counts_repeated_observations_over_all_turns() -> None:
    group = [_episode([b"A", b"B"], 1.0), _episode([b"A", b"A", b"A", b"B"], 0.0)]
    assert trajectories.noop_fraction(group) == pytest.approx(2 / 6)
    assert trajectories.noop_fraction([]) == 0.0


@pytest.mark.parametrize(("keys", "on_path"), [
    ("AAB", [False, True, True]),  # a wall bump, then the way on
    ("ABAC", [False, False, True, True]),  # a detour to B and back to A
    ("ABCBD", [True, False, False, True, True]),  # a dead end at C
    ("ABCA", [False, False, False, True]),  # a loop back to the start
    ("ABCD", [True, True, True, True]),
])
def test_the_loop_erased_path_cuts_out_every_return_to_an_observation(keys: str, on_path: list[bool]) -> None:
    assert trajectories.loop_erased_turns(list(keys), len(keys)) == on_path
    assert trajectories.loop_erased_turns([*keys, "Z"], len(keys)) == on_path  # cut at the turn limit


def test_path_credit_keeps_a_winning_episodes_advantage_on_its_path_only() -> None:
    # A detour A -> C -> A before the way on; the failing episode keeps its advantage everywhere.
    group = [_episode([b"A", b"C", b"A", b"B"], 1.0), _episode([b"A", b"A", b"D"], 0.0)]
    assert trajectories.turn_advantages(group, "none") == [[0.5] * 4, [-0.5] * 3]
    won, lost = trajectories.turn_advantages(group, "none", path_credit="drop")
    assert won == [0.0, 0.0, 0.5, 0.5] and lost == [-0.5] * 3
    won, lost = trajectories.turn_advantages(group, "none", path_credit="shift")
    assert won == [0.0, 0.0, 1.0, 1.0] and lost == [-0.5] * 3  # the winner's total credit stays 2.0


def test_path_credit_moves_only_positive_advantages() -> None:
    on_path = [False, True, True]
    assert trajectories.path_advantages(-1.0, on_path, "shift") == [-1.0] * 3
    assert trajectories.path_advantages(0.6, on_path, "off") == [0.6] * 3
    assert trajectories.path_advantages(0.6, [True] * 3, "shift") == [0.6] * 3
    assert trajectories.path_advantages(0.6, on_path, "shift") == pytest.approx([0.0, 0.9, 0.9])
