"""Episode specs as every environment receives them: a seed, a move budget and string options.

`SpecLike` is what an environment reads (the proto's `EpisodeSpec` is one, so is the plain
`services.common.task.TaskSpec`, which eval sets and tests build). Seeds must be in [0, 2**53): negative seeds
would alias positive ones, and larger ones do not survive the double-precision numbers of the info
Struct. Unknown options are refused (a typo would otherwise silently play a different task).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from services.common.messages import shown
from services.env.errors import invalid

MAX_SEED = 2**53


class SpecLike(Protocol):
    """What an episode spec provides; `mmrl_proto.v1.env_pb2.EpisodeSpec` is one."""

    @property
    def seed(self) -> int: ...
    @property
    def max_moves(self) -> int: ...
    @property
    def options(self) -> Mapping[str, str]: ...


def check_options_and_seed(spec: SpecLike, known: tuple[str, ...], where: str) -> None:
    """Refuses an option not in `known` and a seed outside [0, MAX_SEED) (INVALID_ARGUMENT)."""
    unknown = sorted(set(spec.options) - set(known))
    if unknown:
        raise invalid(f"{where}.options", f"unknown option {shown(unknown[0])} (known: {', '.join(known)})")
    if not 0 <= spec.seed < MAX_SEED:
        raise invalid(f"{where}.seed", f"must be in [0, 2**53), got {spec.seed}")


def check_max_moves(spec: SpecLike, largest: int, where: str) -> int:
    """The spec's move budget (0: the env's default) when within [0, largest]; INVALID_ARGUMENT otherwise."""
    if not 0 <= spec.max_moves <= largest:
        raise invalid(f"{where}.max_moves", f"must be in [0, {largest}] (0: default), got {spec.max_moves}")
    return spec.max_moves


def int_option(options: Mapping[str, str], name: str, default: int, where: str,
               bounds: tuple[int, int] | None = None) -> int:
    """The integer option `name` (`default` when absent), within `bounds` (inclusive) when given;
    INVALID_ARGUMENT naming `where.options.name` otherwise."""
    text = options.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise invalid(f"{where}.options.{name}", f"must be an integer, got {shown(text)}") from None
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        raise invalid(f"{where}.options.{name}", f"must be in [{bounds[0]}, {bounds[1]}], got {value}")
    return value
