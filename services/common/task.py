"""One task of an environment as both sides of EnvService see it: the plain mirror of the proto's
`TaskSpec` (seed, move budget, string options), built by eval sets, training draws and tests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TaskSpec:
    """One task of an environment: a seed, a move budget (0 = the env's default) and options."""

    seed: int
    max_moves: int = 0
    options: Mapping[str, str] = field(default_factory=dict)


def episode_solved(info: Mapping[str, object], total_reward: float) -> bool:
    """Whether an ended episode solved its task, as every eval, the SFT's expert play and the chance
    baseline count it: the env's `info["solved"]` where it reports one, else a positive return."""
    return bool(info.get("solved", total_reward > 0))
