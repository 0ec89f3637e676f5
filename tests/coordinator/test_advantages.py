from __future__ import annotations

import math

import pytest

from services.coordinator.advantages import group_advantages, is_informative, per_token_advantages


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


def test_per_token_advantages_cover_generated_tokens_only() -> None:
    assert per_token_advantages(0.5, [0, 0, 1, 1, 0]) == [0.0, 0.0, 0.5, 0.5, 0.0]


def test_bad_inputs_raise_value_error() -> None:
    with pytest.raises(ValueError):
        group_advantages([])
    with pytest.raises(ValueError):
        group_advantages([1.0], normalize="bogus")  # type: ignore[arg-type]
