"""Dynamic sampling (`sample_step`) with a stand-in for the turn loop: which groups a step keeps."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from services.coordinator.config import RunConfig
from services.coordinator.grpo import runloop
from services.coordinator.grpo.episodes import EpisodeResult, PlayPlan, Sampling
from services.coordinator.ops.wire import TaskSpec


class TaskDraws:
    """An env that answers GetTrainingTasks with `count` specs."""

    async def training_tasks(self, seed: str, count: int, max_moves: int, options: Any) -> list[TaskSpec]:
        assert seed.startswith("mmrl:0:1:")
        return [TaskSpec(seed=k, max_moves=max_moves, options=options) for k in range(count)]


def _step(
    monkeypatch: pytest.MonkeyPatch, informative: set[int], all_solved: bool = False, **grpo: Any
) -> tuple[runloop.SampledStep, list[int]]:
    """Runs sample_step where the n-th maze played (over all rounds) is informative iff n is in
    `informative`; returns the step and the number of mazes played per round. By default the
    episodes of an informative maze alternate between reward 0 and 1; with `all_solved` every episode
    solves its maze, those of an informative maze in different numbers of moves."""
    played: list[int] = []
    per_round: list[int] = []
    expected_greedy = grpo.get("greedy_per_group", 0)

    async def play(_services: Any, _prompting: Any, _policy: Any, plan: PlayPlan, _timers: Any) -> list[EpisodeResult]:
        specs, samples_per_spec = plan.specs, plan.samples_per_spec
        assert plan.greedy_per_spec == expected_greedy
        per_round.append(len(specs))
        episodes = []
        for spec in specs:
            n = len(played)
            played.append(n)
            for k in range(samples_per_spec):
                reward = 1.0 if all_solved else float(k % 2) if n in informative else 0.0
                moves = 4 + k if all_solved and n in informative else 4
                episodes.append(EpisodeResult(spec=spec, group_index=n, conversation=None,  # type: ignore[arg-type]
                                              actions=["up"] * moves, rewards=[0.0] * (moves - 1) + [reward],
                                              episode_id=f"maze{n}"))
        return episodes

    monkeypatch.setattr(runloop, "play_episodes", play)
    config = RunConfig.model_validate({"model": "m", "grpo": {
        "group_size": 2, "tasks_per_step": 4, "group_sampling": "dynamic", **grpo}})
    ctx = runloop.RunContext(run_id="r", config=config, services=SimpleNamespace(env=TaskDraws()),  # type: ignore[arg-type]
                             store=None, shared_root=None, tokenizer=None, chat=None)  # type: ignore[arg-type]
    step = asyncio.run(runloop.sample_step(ctx, 1, 0, Sampling(1.0, 1.0, 4)))
    return step, per_round


def _mazes(step: runloop.SampledStep) -> list[int]:
    return [group[0].group_index for group in step.groups]


def test_dropped_groups_are_replaced_by_a_later_round(monkeypatch: pytest.MonkeyPatch) -> None:
    step, per_round = _step(monkeypatch, informative={0, 2, 4, 5}, max_sampling_rounds=3)
    assert per_round == [4, 2] and _mazes(step) == [0, 2, 4, 5]
    assert step.num_dropped == 2 and step.num_played == 12
    assert [group[0].group_index for group in step.dropped] == [1, 3]
    # The kept groups solve half their episodes; the dropped ones none: 4 of the 12 played.
    assert sum(e.solved for e in step.played) == 4


def test_extra_tasks_replace_dropped_groups_in_the_same_round(monkeypatch: pytest.MonkeyPatch) -> None:
    step, per_round = _step(monkeypatch, informative={0, 2, 4, 5}, max_sampling_rounds=1, extra_tasks=2,
                            greedy_per_group=1)
    assert per_round == [6] and _mazes(step) == [0, 2, 4, 5]
    assert step.num_dropped == 2


def test_the_last_round_fills_the_batch_with_dropped_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    step, per_round = _step(monkeypatch, informative={1, 5}, max_sampling_rounds=2, extra_tasks=1)
    # Round 1: mazes 0-4, only 1 informative; round 2: 3 needed + 1 extra = mazes 5-8, 5 informative.
    assert per_round == [5, 4] and _mazes(step) == [1, 5, 6, 7]
    assert step.num_dropped == 9 - 4
    # What was played and not kept: round 1's uninformative mazes, then round 2's one left over.
    assert [group[0].group_index for group in step.dropped] == [0, 2, 3, 4, 8]


def test_with_a_discount_solved_groups_of_different_lengths_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    step, _ = _step(monkeypatch, informative={1, 3, 4, 5}, all_solved=True, max_sampling_rounds=2, discount=0.9)
    assert _mazes(step) == [1, 3, 4, 5] and step.num_dropped == 2


def test_without_a_discount_groups_that_all_solve_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    step, _ = _step(monkeypatch, informative={1, 3, 4, 5}, all_solved=True, max_sampling_rounds=2)
    assert step.num_dropped == 8 - 4  # no group informative: the batch is filled with dropped ones
    assert _mazes(step) == [4, 5, 6, 7]
