"""Training tasks of the maze environment: seeds drawn from the caller's seed string, of distinct
layouts (a draw is a set of different mazes, so a draw's tail can validate what its head trained),
never a layout reserved for eval sets (services/env/kit/seeds.py), so no eval maze is ever trained on."""

from __future__ import annotations

import functools

from services.env.kit import seeds
from services.env.maze.maze import is_eval_layout, layout_key


def draw_training_seeds(seed: str, count: int, size: int) -> list[int]:
    """`count` training seeds of distinct layouts at grid `size`, a pure function of the arguments;
    ValueError when too few layouts of that size are not reserved for eval sets (2x2 cells have 4)."""

    @functools.cache  # each candidate's layout is carved once
    def layout(candidate: int) -> bytes:
        return layout_key(candidate, size)

    try:
        return seeds.draw_training_seeds(seed, count, reserved=lambda s: is_eval_layout(layout(s)), identity=layout)
    except ValueError as error:
        raise ValueError(f"{error}: at size {size} too few layouts are not reserved for eval sets") from None
