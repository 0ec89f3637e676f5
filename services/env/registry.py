"""The environments the env service can serve, by name (`mmrl serve env --env NAME`).

Each entry makes an `Environment` (services/env/kit/batched.py) from the service's limits. An
environment in this tree is a package of its own under services/env/ plus one line here; one from
elsewhere is added with `register` before the service starts, or served by a server of its own that
passes `mmrl env check` (docs/environments.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from services.env.kit.batched import Environment
from services.env.maze.env import MazeEnv
from services.env.sokoban.env import SokobanEnv

if TYPE_CHECKING:  # the env kit imports without pydantic: the tiny model's tokenizer reads env words
    from services.env.config import EnvConfig

Factory = Callable[["EnvConfig"], Environment]

ENVIRONMENTS: dict[str, Factory] = {
    "maze": MazeEnv,
    "sokoban": SokobanEnv,
}


def register(name: str, factory: Factory) -> None:
    """Adds an environment under `name`; ValueError when the name is taken or empty."""
    if not name or name in ENVIRONMENTS:
        raise ValueError(f"environment name {name!r} is {'taken' if name else 'empty'}")
    ENVIRONMENTS[name] = factory


def names() -> tuple[str, ...]:
    return tuple(ENVIRONMENTS)


def create(name: str, config: EnvConfig) -> Environment:
    """The environment `name` with these limits; ValueError naming the known ones for another."""
    factory = ENVIRONMENTS.get(name)
    if factory is None:
        raise ValueError(f"unknown environment {name!r} (known: {', '.join(ENVIRONMENTS)})")
    return factory(config)
