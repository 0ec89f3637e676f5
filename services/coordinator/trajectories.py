"""From played episodes to the learner's batch: per-turn advantages of each group (GRPO, with the
optional step-level, no-op, invalid-action and path-credit terms of advantages.py) spread over the
generated tokens, and extra trajectories interleaved through the mini-batches."""

from __future__ import annotations

from services.common.trajectory import Trajectory
from services.coordinator.advantages import (
    Normalize,
    PathCredit,
    discounted_return,
    group_advantages,
    loop_erased_turns,
    noop_turns,
    path_advantages,
    per_turn_token_advantages,
    returns_to_go,
    step_advantages,
)
from services.coordinator.episodes import EpisodeResult


def group_returns(group: list[EpisodeResult], discount: float) -> list[float]:
    """The returns the advantages of a group are computed from (the reward, discounted by turns)."""
    return [discounted_return(e.reward, max(1, len(e.actions)), discount) for e in group]


def turn_advantages(
    group: list[EpisodeResult], normalize: Normalize, discount: float = 1.0, step_weight: float = 0.0,
    noop_penalty: float = 0.0, path_credit: PathCredit = "off", invalid_penalty: float = 0.0,
) -> list[list[float]]:
    """Per episode, the advantage of each turn (see advantages.py): the episode's group-relative
    advantage (with `path_credit`, a winner's only on its loop-erased path), plus `step_weight`
    times the step-level advantage among the group's turns taken from the same observation
    (GiGPO), minus `noop_penalty` on the turns that changed nothing and `invalid_penalty` on the
    turns whose action the env could not read."""
    episode = group_advantages(group_returns(group, discount), normalize)
    turns = [len(e.actions) for e in group]
    per_turn = [[a] * n if path_credit == "off" else
                path_advantages(a, loop_erased_turns(e.observation_keys, n), path_credit)
                for a, e, n in zip(episode, group, turns, strict=True)]
    if step_weight != 0.0:
        steps = step_advantages([e.observation_keys[:n] for e, n in zip(group, turns, strict=True)],
                                [returns_to_go(e.reward, n, discount) for e, n in zip(group, turns, strict=True)],
                                normalize)
        per_turn = [[a + step_weight * s for a, s in zip(base, step, strict=True)]
                    for base, step in zip(per_turn, steps, strict=True)]
    if noop_penalty != 0.0:
        per_turn = [[a - noop_penalty * noop for a, noop in zip(base, noop_turns(e.observation_keys, n), strict=True)]
                    for base, e, n in zip(per_turn, group, turns, strict=True)]
    if invalid_penalty != 0.0:
        per_turn = [[a - invalid_penalty * bad for a, bad in zip(base, e.invalid_turns, strict=True)]
                    for base, e in zip(per_turn, group, strict=True)]
    return per_turn


def noop_fraction(episodes: list[EpisodeResult]) -> float:
    """The share of the episodes' turns that changed nothing (wall bumps in the maze)."""
    flags = [f for e in episodes for f in noop_turns(e.observation_keys, len(e.actions))]
    return sum(flags) / len(flags) if flags else 0.0


def to_trajectories(
    groups: list[list[EpisodeResult]], normalize: Normalize, step: int, discount: float = 1.0,
    step_weight: float = 0.0, noop_penalty: float = 0.0, path_credit: PathCredit = "off",
    invalid_penalty: float = 0.0,
) -> list[Trajectory]:
    trajectories = []
    for g, group in enumerate(groups):
        advantages = turn_advantages(group, normalize, discount, step_weight, noop_penalty, path_credit,
                                     invalid_penalty)
        for k, (episode, turns) in enumerate(zip(group, advantages, strict=True)):
            conv = episode.conversation
            trajectories.append(conv.to_trajectory(
                f"s{step}-g{g}-e{k}", per_turn_token_advantages(turns, conv.loss_mask, conv.turn_starts),
                reward=episode.reward, adapter_version=episode.adapter_version, group_id=f"s{step}-g{g}",
            ))
    return trajectories


def interleave(main: list[Trajectory], extra: list[Trajectory]) -> list[Trajectory]:
    """`main` in order with `extra` spread evenly through it, so that the learner's contiguous
    mini-batches each get their share of both."""
    keyed = [((i + 1) / (len(main) + 1), 0, t) for i, t in enumerate(main)]
    keyed += [((j + 1) / (len(extra) + 1), 1, t) for j, t in enumerate(extra)]
    return [t for *_, t in sorted(keyed, key=lambda k: (k[0], k[1]))]
