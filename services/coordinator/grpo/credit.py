"""Credit assignment: a group of episodes in, per-turn advantages out.

Variants are registered by name (`grpo.credit` in the run config) with the environment
capabilities they need (a run whose env lacks one is refused at start with a message naming it) and
the settings they read beyond the common ones (a run that sets one its variant does not read is
refused with the setting named).
- `grpo` (default): every turn of an episode carries the episode's group-relative advantage
  (advantages.group_advantages over the group's discounted returns).
- `gigpo`: GRPO plus `grpo.step_advantage_weight` times the step-level advantage among the group's
  turns taken from the same environment state (the env's state keys), on returns-to-go.
Whatever the variant, `grpo.invalid_penalty` is then taken off every turn whose action the env
could not read (its info.invalid), and `grpo.revisit_penalty` off every turn after which the episode
was back at an observation it had seen (a no-op, or the move that closes a loop).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from services.coordinator.grpo.advantages import (
    Normalize,
    discounted_return,
    group_advantages,
    returns_to_go,
    revisit_turns,
    step_advantages,
)
from services.coordinator.grpo.episodes import EpisodeResult


class CreditSettings(Protocol):
    """The settings credit assignment reads (the run config's `grpo` section)."""

    @property
    def credit(self) -> str: ...
    @property
    def discount(self) -> float: ...
    @property
    def advantage_norm(self) -> Normalize: ...
    @property
    def step_advantage_weight(self) -> float: ...
    @property
    def invalid_penalty(self) -> float: ...
    @property
    def revisit_penalty(self) -> float: ...


Assign = Callable[[list[EpisodeResult], CreditSettings], list[list[float]]]


@dataclass(frozen=True)
class CreditVariant:
    assign: Assign
    needs: tuple[str, ...] = ()  # environment capabilities (EnvInfo.capabilities)
    uses: tuple[str, ...] = ()  # settings only this variant reads


VARIANTS: dict[str, CreditVariant] = {}


def register(name: str, needs: tuple[str, ...] = (), uses: tuple[str, ...] = ()) -> Callable[[Assign], Assign]:
    def add(assign: Assign) -> Assign:
        VARIANTS[name] = CreditVariant(assign, needs, uses)
        return assign
    return add


def group_returns(group: list[EpisodeResult], discount: float) -> list[float]:
    """The returns a group's advantages are computed from."""
    return [discounted_return(e.rewards, discount) for e in group]


@register("grpo")
def grpo(group: list[EpisodeResult], settings: CreditSettings) -> list[list[float]]:
    episode = group_advantages(group_returns(group, settings.discount), settings.advantage_norm)
    return [[a] * len(e.actions) for a, e in zip(episode, group, strict=True)]


@register("gigpo", needs=("state_keys",), uses=("step_advantage_weight",))
def gigpo(group: list[EpisodeResult], settings: CreditSettings) -> list[list[float]]:
    base = grpo(group, settings)
    steps = step_advantages([e.state_keys[:len(e.actions)] for e in group],
                            [returns_to_go(e.rewards, settings.discount) for e in group], settings.advantage_norm)
    weight = settings.step_advantage_weight
    return [[a + weight * s for a, s in zip(b, st, strict=True)] for b, st in zip(base, steps, strict=True)]


def turn_advantages(group: list[EpisodeResult], settings: CreditSettings) -> list[list[float]]:
    """Per episode of the group, the advantage of each turn (the run's variant, then the
    invalid-action and revisit penalties)."""
    per_turn = VARIANTS[settings.credit].assign(group, settings)
    if settings.invalid_penalty != 0.0:
        per_turn = [[a - settings.invalid_penalty * bad for a, bad in zip(turns, e.invalid_turns, strict=True)]
                    for turns, e in zip(per_turn, group, strict=True)]
    if settings.revisit_penalty != 0.0:
        per_turn = [[a - settings.revisit_penalty * back
                     for a, back in zip(turns, revisit_turns(e.observations, len(e.actions)), strict=True)]
                    for turns, e in zip(per_turn, group, strict=True)]
    return per_turn
