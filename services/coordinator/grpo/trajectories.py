"""From played episodes to the learner's batch: each group's per-turn advantages (credit.py) spread
over the generated tokens of each turn."""

from __future__ import annotations

from services.common.trajectory import Trajectory
from services.coordinator.grpo.advantages import noop_turns, per_turn_token_advantages
from services.coordinator.grpo.credit import CreditSettings, turn_advantages
from services.coordinator.grpo.episodes import EpisodeResult


def noop_fraction(episodes: list[EpisodeResult]) -> float:
    """The share of the episodes' turns after which the observation did not change (wall bumps in
    the maze), the last turn of an episode cut by its move budget included."""
    flags = [f for e in episodes for f in noop_turns(e.observations, len(e.actions))]
    return sum(flags) / len(flags) if flags else 0.0


def to_trajectories(groups: list[list[EpisodeResult]], settings: CreditSettings, step: int) -> list[Trajectory]:
    """The learner's batch: one trajectory per episode, or per turn where the run's conversations
    are windowed (`history_window`), each turn's advantage on that turn's generated tokens."""
    trajectories = []
    for g, group in enumerate(groups):
        for k, (episode, turns) in enumerate(zip(group, turn_advantages(group, settings), strict=True)):
            conv = episode.conversation
            advantages = [
                per_turn_token_advantages(turns[seg.first_turn: seg.first_turn + len(seg.turn_starts)],
                                          seg.loss_mask, seg.turn_starts)
                for seg in conv.segments()
            ]
            trajectories += conv.to_trajectories(
                f"s{step}-g{g}-e{k}", advantages, reward=episode.reward,
                adapter_version=episode.adapter_version, group_id=f"s{step}-g{g}",
            )
    return trajectories

