"""Evaluation on a fixed set of tasks: greedy solve rate (one episode per task), sampled solve rate
(k episodes per task at a temperature), sampled pass rate (the share of tasks that at least one of
the k episodes solves: what sampling reaches, where a group of k has a success to reinforce), mean
moves over optimal for solved episodes, and how the greedy episodes that failed did (`failure_modes`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.common.conversation import ChatTokens, Tokenizer
from services.coordinator.grpo.advantages import noop_turns
from services.coordinator.grpo.episodes import (
    EpisodeResult,
    PlayPlan,
    Policy,
    Prompting,
    Sampling,
    Timers,
    invalid_fraction,
    play_episodes,
)
from services.coordinator.grpo.trajectories import noop_fraction
from services.coordinator.ops.replicas import Services
from services.coordinator.ops.wire import TaskSpec


@dataclass(frozen=True)
class EvalPlan:
    specs: list[TaskSpec]
    max_tokens: int
    sampled_samples: int
    sampled_temperature: float
    max_turns: int
    system_prompt: str
    allowed: tuple[tuple[int, ...], ...] = ()  # the run's constrained actions, if any
    history_window: int | None = None  # answered turns each prompt keeps (None: all)


def eval_turn_limit(specs: list[TaskSpec], default: int) -> int:
    """Turns an eval plays: the longest move budget of its mazes (a spec of 0 has `default`). An eval
    set's own budgets decide, not a run's training settings, so a run and `mmrl eval` agree."""
    return max((int(spec.max_moves) or default for spec in specs), default=default)


def solve_rate(episodes: list[EpisodeResult]) -> float:
    return sum(e.solved for e in episodes) / len(episodes) if episodes else 0.0


def pass_rate(episodes: list[EpisodeResult]) -> float:
    """The share of tasks (episode groups) that at least one of their episodes solves."""
    solved: dict[int, bool] = {}
    for episode in episodes:
        solved[episode.group_index] = solved.get(episode.group_index, False) or episode.solved
    return sum(solved.values()) / len(solved) if solved else 0.0


def mean_moves_over_optimal(episodes: list[EpisodeResult]) -> float | None:
    ratios = [
        float(e.info["moves"]) / float(e.info["optimal_moves"])
        for e in episodes
        if e.solved and float(e.info.get("optimal_moves", 0)) > 0
    ]
    return sum(ratios) / len(ratios) if ratios else None


# A failed episode whose last this many turns changed nothing is stuck (failure_modes).
STUCK_TURNS = 3
FAILURE_MODES = ("stuck", "cycling", "other")  # failure_modes' keys
LOOP_MODES = ("stuck", "cycling")  # the failures in a loop: a greedy policy that meets a state again acts as before


def loop_share(failed: Mapping[str, float]) -> float:
    """The share of episodes that failed in a loop (stuck or cycling), from `failure_modes`' shares."""
    return sum(float(failed[mode]) for mode in LOOP_MODES)


def greedy_failures(summary: Mapping[str, Any]) -> dict[str, float]:
    """`failure_modes`' shares of an eval summary's greedy episodes (its `greedy_failed_<mode>`)."""
    return {mode: float(summary[f"greedy_failed_{mode}"]) for mode in FAILURE_MODES}


def returns_to_left_observation(keys: list[str]) -> bool:
    """Whether a sequence of observations comes back to one it had left (a repeat in place, a no-op,
    is not leaving)."""
    left: set[str] = set()
    current: str | None = None
    for key in keys:
        if key == current:
            continue
        if key in left:
            return True
        if current is not None:
            left.add(current)
        current = key
    return False


def failure_modes(episodes: list[EpisodeResult]) -> dict[str, float]:
    """How the episodes that did not solve their task failed, each as a share of all episodes:
    `stuck`: its last STUCK_TURNS turns changed nothing (in the maze, one wall bumped into again and
    again until the move budget ran out: a greedy policy whose bump leaves its prompt almost as it was
    is prone to it); `cycling`: not stuck, and it came back to an observation it had left; `other`:
    the rest (the wrong way, or too slow for the budget)."""
    stuck = cycling = failed = 0
    for episode in episodes:
        if episode.solved:
            continue
        failed += 1
        keys = episode.observations
        noops = noop_turns(keys, len(episode.actions))
        if len(noops) >= STUCK_TURNS and all(noops[-STUCK_TURNS:]):
            stuck += 1
        elif returns_to_left_observation(keys):
            cycling += 1
    total = len(episodes) or 1
    return {"stuck": stuck / total, "cycling": cycling / total, "other": (failed - stuck - cycling) / total}


async def run_eval(
    services: Services, tokenizer: Tokenizer, chat: ChatTokens, plan: EvalPlan, *, run_id: str,
    adapter_version: int, seed: int, timers: Timers, keep_frames: bool = False,
) -> tuple[dict[str, Any], list[EpisodeResult]]:
    """Plays the greedy and sampled evaluations concurrently; returns (summary, greedy episodes)."""
    prompting = Prompting(tokenizer, chat, plan.system_prompt, plan.history_window)
    policy = Policy(run_id, adapter_version)
    calls = [play_episodes(services, prompting, policy, PlayPlan(
        plan.specs, samples_per_spec=1, sampling=Sampling(0.0, 1.0, plan.max_tokens, plan.allowed), max_turns=plan.max_turns,
        seed=seed, keep_frames=keep_frames), timers)]
    if plan.sampled_samples > 0:
        calls.append(play_episodes(services, prompting, policy, PlayPlan(
            plan.specs, samples_per_spec=plan.sampled_samples,
            sampling=Sampling(plan.sampled_temperature, 1.0, plan.max_tokens, plan.allowed), max_turns=plan.max_turns,
            seed=seed + 1), timers))
    outcomes = await asyncio.gather(*calls)
    greedy = outcomes[0]
    sampled = outcomes[1] if len(outcomes) > 1 else []
    summary: dict[str, Any] = {
        "adapter_version": adapter_version,
        "episodes": len(greedy),
        "greedy_solve_rate": solve_rate(greedy),
        "sampled_solve_rate": solve_rate(sampled) if sampled else None,
        "sampled_pass_rate": pass_rate(sampled) if sampled else None,
        "sampled_episodes": len(sampled),
        "mean_moves_over_optimal": mean_moves_over_optimal(greedy),
        "greedy_invalid_fraction": invalid_fraction(greedy),
        "greedy_noop_fraction": noop_fraction(greedy),
        **{f"greedy_failed_{mode}": share for mode, share in failure_modes(greedy).items()},
        "mean_reward": sum(e.reward for e in greedy) / len(greedy) if greedy else 0.0,
    }
    return summary, greedy

