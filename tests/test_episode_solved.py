"""The one rule every eval, the SFT's expert play and the chance baseline count a solve by."""

from __future__ import annotations

from services.common.task import episode_solved


def test_the_env_s_solved_flag_decides_whatever_the_return() -> None:
    assert episode_solved({"solved": True}, 0.0)
    assert not episode_solved({"solved": False}, 1.0)  # a shaped reward can be positive on a failure


def test_without_the_flag_a_positive_return_is_a_solve() -> None:
    assert episode_solved({}, 0.5)
    assert not episode_solved({}, 0.0)
    assert not episode_solved({"optimal_action": "up"}, -1.0)
