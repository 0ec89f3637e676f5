"""Fixed, versioned evaluation sets, kept apart from training by seed and by layout.

Every set's seeds lie in the range `services/common/maze.py` reserves for eval sets
([EVAL_SEED_MIN, EVAL_SEED_MAX) = [1e6, 2e6), `is_eval_seed`), and every maze's layout is one of the
layouts reserved for eval (`is_eval_layout`), which training never plays; a set holds no layout twice
(`eval_seeds`). Eval set "maze-easy-64" v2 (the default): the first 64 such seeds from 1_000_000,
size 9 (4x4 cells), max_moves 20, default start/goal. "maze-hard-64" v2: the first 64 from 1_100_000,
size 11 (5x5 cells), max_moves 32. The seeds are listed in docs/env.md.

v1 took seeds 1_000_000 + i and 1_100_000 + i for i in 0..63 without looking at their layouts: every
v1 easy maze was also the layout of some training seed (40 of the 64 among the SFT's 2,000), and two
of them were the same maze.

Each set's content hash is the sha256 over, per spec in order, the spec as canonical JSON and the
generated layout (`Maze.layout_text`, start and goal included). The hashes are recorded below;
`tests/env/test_evalset.py` fails when generation, seeds or specs change. Changing a set on purpose
means a new version (and a new recorded hash), never a silent edit.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.common.maze import eval_seeds, generate_maze, is_eval_seed
from services.common.messages import shown
from services.env.config import EnvConfig
from services.env.spec import EpisodeSpec, parse_spec

DEFAULT_EVAL_SET = "maze-easy-64"


@dataclass(frozen=True)
class EvalSetRecipe:
    version: str
    first_seed: int
    num_tasks: int
    size: int
    max_moves: int
    recorded_hash: str


RECIPES: dict[str, EvalSetRecipe] = {
    "maze-easy-64": EvalSetRecipe(
        version="v2", first_seed=1_000_000, num_tasks=64, size=9, max_moves=20,
        recorded_hash="a74d58370bbd59e0df53cda0b0b6db36b1d0fcdcf1e46333006b237458703072",
    ),
    "maze-hard-64": EvalSetRecipe(
        version="v2", first_seed=1_100_000, num_tasks=64, size=11, max_moves=32,
        recorded_hash="6675f417c666bb6650d19349b8da6e8a342d85a597c226734aa3ffb21812909c",
    ),
}


@dataclass(frozen=True)
class EvalSet:
    name: str
    version: str
    content_hash: str
    specs: tuple[EpisodeSpec, ...]


def hash_tasks(specs: Sequence[EpisodeSpec], layout_text: Callable[[EpisodeSpec], str]) -> str:
    """sha256 over every spec (canonical JSON) and the text of its generated task (`layout_text`)."""
    digest = hashlib.sha256()
    for spec in specs:
        record = {"seed": spec.seed, "max_moves": spec.max_moves, "options": dict(sorted(spec.options.items()))}
        digest.update(json.dumps(record, sort_keys=True).encode())
        digest.update(b"\n")
        digest.update(layout_text(spec).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def content_hash(specs: Sequence[EpisodeSpec]) -> str:
    """sha256 over every spec (canonical JSON) and its generated layout."""
    config = EnvConfig()

    def layout_text(spec: EpisodeSpec) -> str:
        settings = parse_spec(spec, config)
        return generate_maze(settings.seed, settings.size, settings.start, settings.goal).layout_text()

    return hash_tasks(specs, layout_text)


@functools.cache
def get_eval_set(name: str = "") -> EvalSet:
    """The eval set called `name` ("" = the default set); KeyError for an unknown name."""
    name = name or DEFAULT_EVAL_SET
    if name not in RECIPES:
        raise KeyError(f"unknown eval set {shown(name)} (known: {', '.join(sorted(RECIPES))})")
    recipe = RECIPES[name]
    specs = tuple(
        EpisodeSpec(seed=seed, max_moves=recipe.max_moves, options={"size": str(recipe.size)})
        for seed in eval_seeds(recipe.first_seed, recipe.num_tasks, recipe.size)
    )
    assert all(is_eval_seed(spec.seed) for spec in specs)
    return EvalSet(name=name, version=recipe.version, content_hash=content_hash(specs), specs=specs)
