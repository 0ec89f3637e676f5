"""Training tasks of the maze environment: seeds drawn from the caller's seed string, never a
layout reserved for eval sets (services/common/maze.py), so no eval maze is ever trained on."""

from __future__ import annotations

import itertools
import random

from services.common.maze import TRAIN_SEED_LIMIT, is_eval_layout, layout_key


def draw_training_seeds(seed: str, count: int, size: int) -> list[int]:
    """`count` distinct training seeds at grid `size`, a pure function of the arguments; ValueError
    when nearly every layout of that size is reserved for eval sets (e.g. 2x2 cells have 4)."""
    rng = random.Random(seed)
    seeds: list[int] = []
    for draws in itertools.count():
        if len(seeds) == count:
            break
        if draws == 1000 * count:
            raise ValueError(f"found {len(seeds)} of {count} training mazes in {draws} draws: at size {size} "
                             "nearly every layout is reserved for eval sets")
        candidate = rng.randrange(TRAIN_SEED_LIMIT)
        if not is_eval_layout(layout_key(candidate, size)) and candidate not in seeds:
            seeds.append(candidate)
    return seeds
