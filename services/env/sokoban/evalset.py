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
from dataclasses import dataclass

from services.common.task import TaskSpec
from services.env.kit.evalset import EvalSet, hash_tasks, recipe_named
from services.env.kit.seeds import EVAL_SEED_MAX, EVAL_SEED_MIN, is_eval_seed
from services.env.sokoban.level import distinct_levels, generate_level, level_key

DEFAULT_EVAL_SET = "sokoban-64"


@dataclass(frozen=True)
class SokobanRecipe:
    version: str
    first_seed: int
    num_tasks: int
    size: int
    pulls: int
    max_moves: int
    recorded_hash: str
    apart_from: str = ""
    """Another set whose levels this one leaves out."""


RECIPES: dict[str, SokobanRecipe] = {
    "sokoban-64": SokobanRecipe(
        version="v1", first_seed=1_000_000, num_tasks=64, size=5, pulls=4, max_moves=20,
        recorded_hash="4aa002676b32e8a33520cc24d3bd16ec35046524648b2ced43977576fa4f73b9",
    ),
    "sokoban-held-out-128": SokobanRecipe(
        version="v1", first_seed=1_900_000, num_tasks=128, size=5, pulls=4, max_moves=20,
        recorded_hash="4c80189935bd09738da205aab03d982e157bb80c4176842989b844ac2750aec9", apart_from="sokoban-64",
    ),
}


def task_options(size: int, pulls: int) -> dict[str, str]:
    return {"size": str(size), "pulls": str(pulls)}


def content_hash(specs: Sequence[TaskSpec]) -> str:
    """sha256 over every spec (canonical JSON) and its generated level."""
    return hash_tasks(specs, lambda spec: generate_level(
        spec.seed, int(spec.options["size"]), int(spec.options["pulls"])).layout_text())


@functools.cache
def get_eval_set(name: str = "") -> EvalSet:
    """The eval set called `name` ("" = the default set); KeyError for an unknown name."""
    name = recipe_named(RECIPES, DEFAULT_EVAL_SET, name)
    recipe = RECIPES[name]
    exclude: frozenset[bytes] = frozenset()
    if recipe.apart_from:
        other = RECIPES[recipe.apart_from]
        exclude = frozenset(level_key(generate_level(spec.seed, other.size, other.pulls))
                            for spec in get_eval_set(recipe.apart_from).specs)
    seeds = distinct_levels(range(recipe.first_seed, EVAL_SEED_MAX), recipe.num_tasks, recipe.size, recipe.pulls,
                            reserved=True, exclude=exclude)
    specs = tuple(TaskSpec(seed=seed, max_moves=recipe.max_moves, options=task_options(recipe.size, recipe.pulls))
                  for seed in seeds)
    assert all(is_eval_seed(spec.seed) and spec.seed >= EVAL_SEED_MIN for spec in specs)
    return EvalSet(name=name, version=recipe.version, content_hash=content_hash(specs), specs=specs)
