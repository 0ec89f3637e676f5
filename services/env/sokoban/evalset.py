"""Sokoban's fixed, versioned eval sets, kept apart from training by seed and by level.

Every set's seeds lie in the eval range [EVAL_SEED_MIN, EVAL_SEED_MAX) = [1e6, 2e6) and every level
is one reserved for eval (`is_eval_level`), which training never plays; a set holds no level twice.
- "sokoban-64" v1 (the default): the first 64 such seeds from 1_000_000; room 5x5, pulls 4,
  max_moves 20.
- "sokoban-held-out-128" v1: the first 128 such seeds from 1_900_000 whose levels are not in
  "sokoban-64"; same settings. Levels no training plays and the fixed set does not hold, for checks
  that must not look at the fixed set (e.g. choosing an SFT checkpoint).

Each set's content hash is the sha256 over, per spec in order, the spec as canonical JSON and the
generated level (`Level.layout_text`). The hashes are recorded below; tests/env/sokoban fails when
generation, seeds or specs change. Changing a set on purpose means a new version and a new hash.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from services.common.task import TaskSpec
from services.env.kit.evalset import EvalSet, Recipe, build_eval_set, hash_tasks, recipe_named
from services.env.sokoban.level import Level, generate_level, level_key

DEFAULT_EVAL_SET = "sokoban-64"


def task_options(size: int, pulls: int) -> dict[str, str]:
    return {"size": str(size), "pulls": str(pulls)}


RECIPES: dict[str, Recipe] = {
    "sokoban-64": Recipe(
        version="v1", first_seed=1_000_000, num_tasks=64, max_moves=20, options=task_options(5, 4),
        recorded_hash="4aa002676b32e8a33520cc24d3bd16ec35046524648b2ced43977576fa4f73b9",
    ),
    "sokoban-held-out-128": Recipe(
        version="v1", first_seed=1_900_000, num_tasks=128, max_moves=20, options=task_options(5, 4),
        recorded_hash="4c80189935bd09738da205aab03d982e157bb80c4176842989b844ac2750aec9", apart_from=("sokoban-64",),
    ),
    "sokoban-held-out-512": Recipe(
        version="v1", first_seed=1_500_000, num_tasks=512, max_moves=20, options=task_options(5, 4),
        recorded_hash="574583c4a5f64dc19fc47ea53cccad71e647fda93a9bef38c904276f3bbe5ce3",
        apart_from=("sokoban-64", "sokoban-held-out-128"),
    ),
}


def _level(spec: TaskSpec) -> Level:
    return generate_level(spec.seed, int(spec.options["size"]), int(spec.options["pulls"]))


def task_key(spec: TaskSpec) -> bytes:
    """The level key of the task's level."""
    return level_key(_level(spec))


def content_text(spec: TaskSpec) -> str:
    """The task's generated level."""
    return _level(spec).layout_text()


def content_hash(specs: Sequence[TaskSpec]) -> str:
    """sha256 over every spec (canonical JSON) and its generated level."""
    return hash_tasks(specs, content_text)


@functools.cache
def get_eval_set(name: str = "") -> EvalSet:
    """The eval set called `name` ("" = the default set); KeyError for an unknown name."""
    name = recipe_named(RECIPES, DEFAULT_EVAL_SET, name)
    return build_eval_set(name, RECIPES, get_eval_set, task_key, content_text)
