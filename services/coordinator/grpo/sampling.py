"""Which of the groups a step plays it trains on: strategies registered by name (`grpo.group_sampling`
in the run config), as credit variants are (credit.py).

- `plain`: one round of B tasks (`grpo.tasks_per_step`); every group is trained on.
- `dynamic` (DAPO's dynamic sampling): a group whose returns are all equal carries no gradient. Each
  round plays the tasks still needed plus `grpo.extra_tasks`; the informative groups fill the batch in
  play order, for at most `grpo.max_sampling_rounds` rounds; then uninformative groups of the last
  round fill what is left, so the batch is always full.

A strategy names the settings it reads (`uses`): a run that sets one its strategy does not read is
refused with the setting named (config.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from services.coordinator.grpo.advantages import is_informative
from services.coordinator.grpo.credit import group_returns
from services.coordinator.grpo.episodes import EpisodeResult


class SamplingSettings(Protocol):
    """The settings a strategy reads (the run config's `grpo` section)."""

    @property
    def discount(self) -> float: ...
    @property
    def max_sampling_rounds(self) -> int: ...
    @property
    def extra_tasks(self) -> int: ...


@dataclass(frozen=True)
class GroupSampling:
    rounds: Callable[[SamplingSettings], int]
    """Rounds of play a step may take."""
    extra_tasks: Callable[[SamplingSettings], int]
    """Tasks played per round beyond those still needed."""
    keeps: Callable[[list[EpisodeResult], SamplingSettings], bool]
    """Whether a group played in a round is trained on (the others may fill the batch at the end)."""
    uses: tuple[str, ...] = ()


STRATEGIES: dict[str, GroupSampling] = {
    "plain": GroupSampling(rounds=lambda s: 1, extra_tasks=lambda s: 0, keeps=lambda group, s: True),
    "dynamic": GroupSampling(
        rounds=lambda s: s.max_sampling_rounds, extra_tasks=lambda s: s.extra_tasks,
        keeps=lambda group, s: is_informative(group_returns(group, s.discount)),
        uses=("max_sampling_rounds", "extra_tasks")),
}
