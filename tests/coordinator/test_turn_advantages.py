"""Advantages of a group of played episodes, per turn and per token (`credit.turn_advantages`,
`trajectories.to_trajectories`): the registered variants (episode-level GRPO, GiGPO's step-level
term on the env's state keys), per-turn rewards, and the invalid-action and revisit penalties."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.conversation import TokenConversation
from services.coordinator.config import GrpoSettings
from services.coordinator.grpo import credit, trajectories
from services.coordinator.grpo.advantages import noop_turns, revisit_turns
from services.coordinator.grpo.episodes import EpisodeResult, invalid_fraction, observation_key
from services.coordinator.ops.wire import TaskSpec
from tests.coordinator.chat import CHAT, CharTokenizer


def _episode(states: list[bytes], reward: float | list[float], invalid: list[bool] | None = None) -> EpisodeResult:
    """An episode that acted once from each frame in `states` (one generated token per turn), its
    state keys the frames; `reward` is the last turn's (sparse) or every turn's; `invalid` flags
    the turns whose action the env could not read (none by default)."""
    conv = TokenConversation(CHAT)
    for frame in states:
        conv.compact_ids += [1, 7, 3, 4, 5, 2, 6, 1, 8]
        conv.images.append(frame)
        conv.add_generation(conv.record_ids + conv.compact_ids[len(conv.record_ids):], [10], [-0.5])
    rewards = reward if isinstance(reward, list) else [0.0] * (len(states) - 1) + [reward]
    return EpisodeResult(spec=TaskSpec(seed=1), group_index=0, conversation=conv,
                         actions=["up"] * len(states), rewards=rewards,
                         observation_keys=[observation_key([f]) for f in states],
                         state_keys=[f.decode() for f in states],
                         invalid_turns=invalid if invalid is not None else [False] * len(states))


def _grpo(**settings: Any) -> GrpoSettings:
    return GrpoSettings(advantage_norm=settings.pop("norm", "none"), **settings)


def test_observation_keys_tell_images_apart() -> None:
    assert observation_key([b"ab"]) == observation_key([b"ab"])
    assert observation_key([b"ab"]) != observation_key([b"a", b"b"]) != observation_key([b"ba"])


def test_grpo_gives_every_turn_the_episode_advantage() -> None:
    group = [_episode([b"A", b"B"], 1.0), _episode([b"A", b"C", b"D"], 0.0)]
    solved, failed = credit.turn_advantages(group, _grpo(norm="std"))
    assert solved == pytest.approx([1.0, 1.0], rel=1e-5) and failed == pytest.approx([-1.0] * 3, rel=1e-5)


def test_shaped_rewards_all_count_in_the_return() -> None:
    # Same terminal outcome; the first earned a shaped reward on its way.
    group = [_episode([b"A", b"B"], [0.5, 1.0]), _episode([b"A", b"C"], [0.0, 1.0])]
    first, second = credit.turn_advantages(group, _grpo())
    assert first == [0.25, 0.25] and second == [-0.25, -0.25]
    assert group[0].reward == 1.5


def test_gigpo_adds_the_step_term_among_turns_taken_from_the_same_state() -> None:
    # Both solve; the second bumps a wall first (state A repeats), so it is one move slower.
    group = [_episode([b"A", b"B"], 1.0), _episode([b"A", b"A", b"B"], 1.0)]
    plain = credit.turn_advantages(group, _grpo(discount=0.5))
    assert plain == [[0.125, 0.125], [-0.125, -0.125, -0.125]]  # returns 0.5 and 0.25
    gigpo = credit.turn_advantages(group, _grpo(discount=0.5, credit="gigpo", step_advantage_weight=1.0))
    a = 5 / 12  # mean return from state A: (0.5 + 0.25 + 0.5) / 3
    assert gigpo[0] == pytest.approx([0.125 + 0.5 - a, 0.125])
    assert gigpo[1] == pytest.approx([-0.125 + 0.25 - a, -0.125 + 0.5 - a, -0.125])


def test_variants_are_registered_by_name_with_the_capabilities_they_need() -> None:
    assert credit.VARIANTS["grpo"].needs == () and credit.VARIANTS["gigpo"].needs == ("state_keys",)
    with pytest.raises(ValueError, match="not a registered variant"):
        GrpoSettings(credit="nope")


def test_trajectories_carry_each_turns_advantage_on_its_generated_tokens() -> None:
    group = [_episode([b"A", b"B"], 1.0), _episode([b"A", b"A", b"B"], 1.0)]
    settings = _grpo(discount=0.5, credit="gigpo", step_advantage_weight=1.0)
    built = trajectories.to_trajectories([group], settings, step=3)
    expected = credit.turn_advantages(group, settings)
    for trajectory, turns in zip(built, expected, strict=True):
        generated = [a for a, m in zip(trajectory.advantages, trajectory.loss_mask, strict=True) if m]
        assert generated == pytest.approx(turns)
        assert all(a == 0.0 for a, m in zip(trajectory.advantages, trajectory.loss_mask, strict=True) if not m)


def test_a_windowed_episode_is_one_trajectory_per_turn_each_with_its_turns_advantage() -> None:
    def windowed(states: list[bytes], reward: float) -> EpisodeResult:
        conv = TokenConversation(CHAT, window=0)
        for frame in states:
            conv.add_observation(CharTokenizer(), "go", [frame])
            conv.add_generation(list(conv.compact_ids), [10], [-0.5])
        whole = _episode(states, reward)
        whole.conversation = conv
        return whole

    group = [windowed([b"A", b"B"], 1.0), windowed([b"A", b"A", b"B"], 0.0)]
    settings = _grpo(discount=0.5, credit="gigpo", step_advantage_weight=1.0)
    built = trajectories.to_trajectories([group], settings, step=3)
    expected = [a for turns in credit.turn_advantages(group, settings) for a in turns]
    assert [t.trajectory_id for t in built] == ["s3-g0-e0-t0", "s3-g0-e0-t1", "s3-g0-e1-t0", "s3-g0-e1-t1",
                                                "s3-g0-e1-t2"]
    assert [t.segments for t in built] == [2, 2, 3, 3, 3]
    assert [t.images for t in built] == [(b"A",), (b"B",), (b"A",), (b"A",), (b"B",)]
    for trajectory, advantage in zip(built, expected, strict=True):
        assert [a for a, m in zip(trajectory.advantages, trajectory.loss_mask, strict=True) if m] == [advantage]


def test_noop_turns_are_the_turns_after_which_the_observation_repeats() -> None:
    keys = ["A", "A", "B", "B", "C"]
    assert noop_turns(keys, 5) == [True, False, True, False, False]  # ended: no next observation
    assert noop_turns(keys, 4) == [True, False, True, False]  # cut at the turn limit
    with pytest.raises(ValueError, match="observations for"):
        noop_turns(keys, 3)


def test_the_invalid_penalty_lowers_only_the_turns_the_env_could_not_read() -> None:
    # The first solves after an unreadable first action; the second fails cleanly.
    group = [_episode([b"A", b"A", b"B"], 1.0, invalid=[True, False, False]), _episode([b"A", b"C"], 0.0)]
    assert credit.turn_advantages(group, _grpo()) == [[0.5] * 3, [-0.5] * 2]
    assert credit.turn_advantages(group, _grpo(invalid_penalty=1.0)) == [[-0.5, 0.5, 0.5], [-0.5, -0.5]]
    assert invalid_fraction(group) == pytest.approx(1 / 5)


def test_revisit_turns_are_no_ops_and_the_moves_that_close_a_loop() -> None:
    keys = ["A", "A", "B", "C", "B", "D", "A"]
    # A->A no-op; A->B, B->C new; C->B back at B; B->D new; D->A back at A; the last ended.
    assert revisit_turns(keys, 7) == [True, False, False, True, False, True, False]
    assert revisit_turns(keys, 6) == [True, False, False, True, False, True]  # cut: the seventh key is its next
    with pytest.raises(ValueError, match="observations for"):
        revisit_turns(keys, 5)


def test_the_revisit_penalty_lowers_only_the_turns_that_come_back() -> None:
    # The first solves after a wall bump and a step back to its start; the second fails without looping.
    winner = _episode([b"A", b"A", b"B", b"A", b"B", b"C"], 1.0)
    group = [winner, _episode([b"A", b"C"], 0.0)]
    assert credit.turn_advantages(group, _grpo()) == [[0.5] * 6, [-0.5] * 2]
    # Turn 0 (A->A), turn 2 (B->A) and turn 3 (A->B, seen) come back; the winner's last turn ended it.
    assert credit.turn_advantages(group, _grpo(revisit_penalty=1.0)) == [
        [-0.5, 0.5, -0.5, -0.5, 0.5, 0.5], [-0.5, -0.5]]
    # Under GiGPO too, the penalty comes off the variant's advantages.
    plain, penalised = (credit.turn_advantages(group, _grpo(credit="gigpo", revisit_penalty=p)) for p in (0.0, 0.25))
    assert [a - b for a, b in zip(plain[0], penalised[0], strict=True)] == [0.25, 0.0, 0.25, 0.25, 0.0, 0.0]
    assert penalised[1] == plain[1]


def test_dynamic_sampling_keeps_groups_by_their_returns_not_by_a_penalty() -> None:
    from services.coordinator.grpo.sampling import STRATEGIES

    keeps = STRATEGIES["dynamic"].keeps
    looping = [_episode([b"A", b"B", b"A", b"C"], 0.0), _episode([b"A", b"C"], 0.0)]  # both fail
    settings = _grpo(revisit_penalty=0.5)
    assert credit.turn_advantages(looping, settings)[0] == [0.0, -0.5, 0.0, 0.0]
    assert not keeps(looping, settings)  # a penalty alone does not earn a group its slot in the batch
    assert keeps([_episode([b"A", b"C"], 1.0), _episode([b"A", b"C"], 0.0)], settings)


def test_noop_fraction_counts_repeated_observations_over_all_turns() -> None:
    group = [_episode([b"A", b"B"], 1.0), _episode([b"A", b"A", b"A", b"B"], 0.0)]
    assert trajectories.noop_fraction(group) == pytest.approx(2 / 6)
    assert trajectories.noop_fraction([]) == 0.0
