"""Eval summaries: solve rate, the share of mazes some sampled episode solves, moves over optimal."""

from __future__ import annotations

from services.coordinator.grpo.episodes import EpisodeResult
from services.coordinator.grpo.evaluation import failure_modes, mean_moves_over_optimal, pass_rate, solve_rate
from services.coordinator.grpo.trajectories import noop_fraction
from services.coordinator.ops.wire import TaskSpec


def _episode(group: int, solved: bool, moves: int = 6, optimal: int = 6) -> EpisodeResult:
    return EpisodeResult(spec=TaskSpec(seed=group), group_index=group, conversation=None,  # type: ignore[arg-type]
                         rewards=[1.0 if solved else 0.0],
                         info={"solved": solved, "moves": moves, "optimal_moves": optimal})


def test_pass_rate_counts_a_maze_once_when_any_of_its_episodes_solves_it() -> None:
    # Maze 0: 1 of 3 solved; maze 1: none; maze 2: all 3; maze 3: none.
    outcomes = {0: [False, True, False], 1: [False, False, False], 2: [True, True, True], 3: [False, False, False]}
    episodes = [_episode(group, solved) for group, results in outcomes.items() for solved in results]
    assert pass_rate(episodes) == 2 / 4
    assert solve_rate(episodes) == 4 / 12


def test_pass_rate_equals_solve_rate_with_one_episode_per_maze() -> None:
    episodes = [_episode(0, True), _episode(1, False), _episode(2, True)]
    assert pass_rate(episodes) == solve_rate(episodes) == 2 / 3


def test_empty_evaluations_rate_zero() -> None:
    assert pass_rate([]) == solve_rate([]) == 0.0
    assert mean_moves_over_optimal([]) is None


def test_moves_over_optimal_counts_solved_episodes_only() -> None:
    episodes = [_episode(0, True, moves=9, optimal=6), _episode(1, False, moves=20, optimal=6),
                _episode(2, True, moves=6, optimal=6)]
    assert mean_moves_over_optimal(episodes) == (1.5 + 1.0) / 2


def test_an_eval_plays_its_mazes_own_move_budgets_not_the_runs_turn_cap() -> None:
    from services.coordinator.grpo.evaluation import eval_turn_limit

    hard = [TaskSpec(seed=1, max_moves=32), TaskSpec(seed=2, max_moves=20)]
    assert eval_turn_limit(hard, default=20) == 32  # a run of env.max_moves 20 cut these at 20
    assert eval_turn_limit([TaskSpec(seed=1)], default=20) == 20
    assert eval_turn_limit([], default=20) == 20


def _walk(keys: str, solved: bool = False, final: str = "") -> EpisodeResult:
    """An episode that saw the observations named by the letters of `keys` (one per turn), then `final`."""
    return EpisodeResult(spec=TaskSpec(seed=0), group_index=0, conversation=None,  # type: ignore[arg-type]
                         actions=["up"] * len(keys), rewards=[0.0] * (len(keys) - 1) + [1.0 if solved else 0.0],
                         info={"solved": solved}, observation_keys=list(keys), final_observation_key=final)


def test_failed_greedy_episodes_are_told_apart_stuck_cycling_or_other() -> None:
    episodes = [
        _walk("abcddd", final="d"),  # the last three moves bumped: stuck
        _walk("abcdd", final="d"),   # two bumps only, no return: other
        _walk("abcbcd", final="e"),  # back to b after leaving it: cycling
        _walk("abbbcd", final="e"),  # bumps in place are not returns: other
        _walk("abcd", solved=True, final="g"),
    ]
    assert failure_modes(episodes) == {"stuck": 0.2, "cycling": 0.2, "other": 0.4}
    assert failure_modes([]) == {"stuck": 0.0, "cycling": 0.0, "other": 0.0}


def test_the_noop_share_counts_the_last_bump_of_an_episode_cut_by_its_budget() -> None:
    # a->a, a->b, b->b, then the budget ran out on b: three of four moves changed nothing.
    assert noop_fraction([_walk("aabb", final="b")]) == 3 / 4
    # An episode that ended by solving has no bump at its end.
    assert noop_fraction([_walk("ab", solved=True, final="c")]) == 0.0
