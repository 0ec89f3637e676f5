"""Seed ranges and the eval-reserved share of tasks: the contract that keeps training away from eval sets.

Training seeds lie in [0, TRAIN_SEED_LIMIT) = [0, 1e6); [EVAL_SEED_MIN, EVAL_SEED_MAX) = [1e6, 2e6) is
reserved for eval sets (`is_eval_seed`). Disjoint seeds are not disjoint tasks: a generator may make the
same task from many seeds (the maze's backtracker carves about 3,800 distinct 4x4 layouts). So tasks are
split too: a task whose key (a hash of what it is, e.g. the maze's walls) falls in one of
EVAL_LAYOUT_SHARE buckets is reserved for evaluation (`is_reserved`, about one in 8). Eval sets hold
only reserved tasks; training skips them (`draw_training_seeds`), whatever their seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Iterable

TRAIN_SEED_LIMIT = 1_000_000
EVAL_SEED_MIN = 1_000_000
EVAL_SEED_MAX = 2_000_000
EVAL_LAYOUT_SHARE = 8  # one task in 8 (by the hash of its key) is reserved for eval sets


def is_eval_seed(seed: int) -> bool:
    """Whether `seed` lies in the range reserved for eval sets (training must not use it)."""
    return EVAL_SEED_MIN <= seed < EVAL_SEED_MAX


def is_reserved(key: bytes) -> bool:
    """Whether the task whose key (a sha256 digest of what it is) is this is reserved for eval sets."""
    return int.from_bytes(key[:8], "big") % EVAL_LAYOUT_SHARE == 0


def draw_training_seeds(seed: str, count: int, reserved: Callable[[int], bool],
                        identity: Callable[[int], Hashable] = lambda s: s) -> list[int]:
    """`count` training seeds drawn from [0, TRAIN_SEED_LIMIT) by `random.Random(seed)`, none of whose
    tasks is `reserved`, each of a distinct `identity` (the seed itself, or e.g. the task it makes): a
    pure function of the arguments. ValueError when 1000 * count draws do not find them (nearly every
    task is reserved, or there are too few distinct ones)."""
    rng = random.Random(seed)
    seeds: list[int] = []
    seen: set[Hashable] = set()
    for _ in range(1000 * count):
        if len(seeds) == count:
            return seeds
        candidate = rng.randrange(TRAIN_SEED_LIMIT)
        if reserved(candidate):
            continue
        identified = identity(candidate)
        if identified not in seen:
            seen.add(identified)
            seeds.append(candidate)
    if len(seeds) < count:
        raise ValueError(f"found {len(seeds)} of {count} distinct training tasks in {1000 * count} draws")
    return seeds


def distinct_seeds(seeds: Iterable[int], count: int, key: Callable[[int], bytes], *, reserved: bool,
                   exclude: frozenset[bytes] = frozenset()) -> list[int]:
    """The first `count` of `seeds` whose tasks are (reserved=True) or are not reserved for eval sets,
    distinct, and not among `exclude`; ValueError when `seeds` runs out first."""
    out: list[int] = []
    seen: set[bytes] = set(exclude)
    for seed in seeds:
        if len(out) == count:
            break
        task = key(seed)
        if is_reserved(task) == reserved and task not in seen:
            seen.add(task)
            out.append(seed)
    if len(out) < count:
        raise ValueError(f"{len(out)} of {count} distinct {'eval' if reserved else 'training'} tasks in the seeds given")
    return out
