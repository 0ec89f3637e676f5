"""Fixed, versioned eval sets: what every environment's eval sets are made of and looked up by.

An eval set is a name, a version, a tuple of specs and the sha256 of their content (`hash_tasks`:
per spec in order, the spec as canonical JSON and the text of the task it generates). Each
environment records the hashes of its sets beside their recipes and tests that they still hold:
changing a set on purpose means a new version and a new hash, never a silent edit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from services.common.messages import shown
from services.common.task import TaskSpec
from services.env.kit.seeds import EVAL_SEED_MAX, distinct_seeds, is_eval_seed


@dataclass(frozen=True)
class EvalSet:
    name: str
    version: str
    content_hash: str
    specs: tuple[TaskSpec, ...]


def hash_tasks(specs: Sequence[TaskSpec], task_text: Callable[[TaskSpec], str]) -> str:
    """sha256 over every spec (canonical JSON) and the text of its generated task (`task_text`)."""
    digest = hashlib.sha256()
    for spec in specs:
        record = {"seed": spec.seed, "max_moves": spec.max_moves, "options": dict(sorted(spec.options.items()))}
        digest.update(json.dumps(record, sort_keys=True).encode())
        digest.update(b"\n")
        digest.update(task_text(spec).encode())
        digest.update(b"\n")
    return digest.hexdigest()


@dataclass(frozen=True)
class Recipe:
    """How an eval set is drawn: the first `num_tasks` eval-range seeds from `first_seed` whose tasks
    (with `options`) are reserved for eval, distinct, and in none of the sets `apart_from` names."""

    version: str
    first_seed: int
    num_tasks: int
    max_moves: int
    options: Mapping[str, str]
    recorded_hash: str
    apart_from: tuple[str, ...] = ()


def build_eval_set(name: str, recipes: Mapping[str, Recipe], get: Callable[[str], EvalSet],
                   task_key: Callable[[TaskSpec], bytes], task_text: Callable[[TaskSpec], str]) -> EvalSet:
    """The eval set `name` of `recipes` (KeyError for another name is the caller's `recipe_named`):
    its tasks' keys (`task_key`) decide what is reserved and distinct, their text (`task_text`) the hash."""
    recipe = recipes[name]
    exclude = frozenset(task_key(spec) for other in recipe.apart_from for spec in get(other).specs)

    def spec_of(seed: int) -> TaskSpec:
        return TaskSpec(seed=seed, max_moves=recipe.max_moves, options=dict(recipe.options))

    seeds = distinct_seeds(range(recipe.first_seed, EVAL_SEED_MAX), recipe.num_tasks,
                           lambda seed: task_key(spec_of(seed)), reserved=True, exclude=exclude)
    specs = tuple(spec_of(seed) for seed in seeds)
    assert all(is_eval_seed(spec.seed) for spec in specs)
    return EvalSet(name=name, version=recipe.version, content_hash=hash_tasks(specs, task_text), specs=specs)


def recipe_named(recipes: Mapping[str, object], default: str, name: str) -> str:
    """The name of the set asked for ("" = `default`); KeyError naming the known sets for another."""
    name = name or default
    if name not in recipes:
        raise KeyError(f"unknown eval set {shown(name)} (known: {', '.join(sorted(recipes))})")
    return name
