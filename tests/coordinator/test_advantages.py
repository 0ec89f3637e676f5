from __future__ import annotations

import math

import pytest

from services.coordinator.grpo.advantages import (
    discounted_return,
    group_advantages,
    is_informative,
    per_turn_token_advantages,
    returns_to_go,
    step_advantages,
)


def test_std_normalised_advantages_match_hand_computed_values() -> None:
    # rewards 1,0,0,1: mean 0.5, population std 0.5 -> +-1
    assert group_advantages([1, 0, 0, 1], eps=0.0) == [1.0, -1.0, -1.0, 1.0]
    # rewards 1,0,0,0: mean 0.25, std sqrt(3)/4
    adv = group_advantages([1, 0, 0, 0], eps=0.0)
    assert math.isclose(adv[0], 0.75 / (math.sqrt(3) / 4))
    assert math.isclose(adv[1], -0.25 / (math.sqrt(3) / 4))


def test_dr_grpo_mode_only_centres_the_rewards() -> None:
    assert group_advantages([1, 0, 0, 0], normalize="none") == [0.75, -0.25, -0.25, -0.25]


def test_a_group_with_equal_rewards_has_zero_advantages_and_no_signal() -> None:
    assert group_advantages([1, 1, 1]) == [0.0, 0.0, 0.0]
    assert not is_informative([0, 0, 0])
    assert is_informative([0, 1, 0])


def test_advantages_sum_to_zero_within_a_group() -> None:
    assert abs(sum(group_advantages([0.3, 0.9, 0.1, 0.5]))) < 1e-9


def test_per_token_advantages_cover_each_turns_generated_tokens_only() -> None:
    # Two turns starting at record positions 0 and 4; generated tokens at 2-3 and 6.
    mask = [0, 0, 1, 1, 0, 0, 1, 0]
    assert per_turn_token_advantages([0.5, -1.0], mask, [0, 4]) == [0, 0, 0.5, 0.5, 0, 0, -1.0, 0]
    with pytest.raises(ValueError):
        per_turn_token_advantages([0.5], mask, [0, 4])


def test_bad_inputs_raise_value_error() -> None:
    with pytest.raises(ValueError):
        group_advantages([])
    with pytest.raises(ValueError):
        group_advantages([1.0], normalize="bogus")  # type: ignore[arg-type]


def test_the_return_sums_every_turns_reward_discounted_by_its_turn() -> None:
    assert discounted_return([1.0], 0.9) == 1.0
    assert math.isclose(discounted_return([0.0] * 6 + [1.0], 0.9), 0.9**6)  # sparse: the last turn's
    assert discounted_return([0.0] * 20, 0.9) == 0.0
    assert discounted_return([0.0] * 11 + [1.0], 1.0) == 1.0  # no discount: the plain reward
    assert math.isclose(discounted_return([0.5, -0.25, 1.0], 0.5), 0.5 - 0.125 + 0.25)  # shaped rewards


def test_with_a_discount_the_faster_of_two_solvers_gets_the_positive_advantage() -> None:
    returns = [discounted_return([0.0] * (turns - 1) + [1.0], 0.9) for turns in (6, 10)]
    assert not is_informative([1.0, 1.0]) and is_informative(returns)
    fast, slow = group_advantages(returns)
    assert fast > 0 > slow


def test_bad_discounts_and_empty_episodes_raise_value_error() -> None:
    for discount in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError):
            discounted_return([0.0, 1.0], discount)
    with pytest.raises(ValueError):
        discounted_return([], 0.9)


def test_returns_to_go_sum_the_discounted_rewards_from_each_turn_on() -> None:
    assert returns_to_go([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert returns_to_go([0.0, 0.0], 0.5) == [0.0, 0.0]
    assert returns_to_go([1.0, 0.0, 2.0], 0.5) == [1.5, 1.0, 2.0]


def test_step_advantages_compare_turns_taken_from_the_same_state() -> None:
    # Episode 0: A -> B -> goal. Episode 1: A, bumps a wall (still A), then A -> B -> goal.
    states = [["A", "B"], ["A", "A", "B"]]
    returns = [returns_to_go([0.0, 1.0], 0.5), returns_to_go([0.0, 0.0, 1.0], 0.5)]  # [0.5, 1], [0.25, 0.5, 1]
    adv = step_advantages(states, returns, normalize="none")
    # State A was acted from three times, with returns 0.5, 0.25, 0.5 (mean 5/12).
    assert adv[0][0] == pytest.approx(0.5 - 5 / 12) and adv[1][0] == pytest.approx(0.25 - 5 / 12)
    assert adv[1][1] == pytest.approx(0.5 - 5 / 12)
    assert adv[0][1] == adv[1][2] == 0.0  # B: both moves reached the goal at once


def test_a_state_seen_once_has_no_step_advantage() -> None:
    assert step_advantages([["A", "B"], ["C"]], [[0.5, 1.0], [0.0]]) == [[0.0, 0.0], [0.0]]
    with pytest.raises(ValueError):
        step_advantages([["A", "B"]], [[1.0]])
