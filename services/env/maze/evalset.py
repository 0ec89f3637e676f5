"""Fixed, versioned evaluation sets, kept apart from training by seed and by layout.

Every set's seeds lie in the range reserved for eval sets (services/env/kit/seeds.py:
[EVAL_SEED_MIN, EVAL_SEED_MAX) = [1e6, 2e6), `is_eval_seed`), and every maze's layout is one of the
layouts reserved for eval (`is_eval_layout`), which training never plays; a set holds no layout twice
(`eval_seeds`). Eval set "maze-easy-64" v2 (the default): the first 64 such seeds from 1_000_000,
size 9 (4x4 cells), max_moves 20, default start/goal. "maze-hard-64" v2: the first 64 from 1_100_000,
size 11 (5x5 cells), max_moves 32. "maze-held-out-256" v2: the first 256 such seeds from 1_900_000
whose layouts "maze-easy-64" does not hold, size 9, max_moves 20: mazes no training plays, outside the
fixed set, for checks that must not look at it. The seeds are listed in docs/env.md.

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
from collections.abc import Sequence

from services.common.task import TaskSpec
from services.env.kit.evalset import EvalSet, Recipe, build_eval_set, hash_tasks, recipe_named
from services.env.maze.maze import generate_maze, layout_key
from services.env.maze.spec import parse_spec

DEFAULT_EVAL_SET = "maze-easy-64"


def _maze(size: int) -> dict[str, str]:
    return {"size": str(size)}


RECIPES: dict[str, Recipe] = {
    "maze-easy-64": Recipe(
        version="v2", first_seed=1_000_000, num_tasks=64, max_moves=20, options=_maze(9),
        recorded_hash="a74d58370bbd59e0df53cda0b0b6db36b1d0fcdcf1e46333006b237458703072",
    ),
    "maze-hard-64": Recipe(
        version="v2", first_seed=1_100_000, num_tasks=64, max_moves=32, options=_maze(11),
        recorded_hash="6675f417c666bb6650d19349b8da6e8a342d85a597c226734aa3ffb21812909c",
    ),
    "maze-held-out-256": Recipe(
        version="v2", first_seed=1_900_000, num_tasks=256, max_moves=20, options=_maze(9), apart_from=("maze-easy-64",),
        recorded_hash="103ca109588fcbd5f29b3c13e4501b375dff4d8573b05ecbcbf7340c15cfa63c",
    ),
}


def task_key(spec: TaskSpec) -> bytes:
    """The layout key of the task's maze."""
    return layout_key(spec.seed, int(spec.options["size"]))


def content_text(spec: TaskSpec) -> str:
    """The task's generated layout, start and goal included."""
    from services.env.config import EnvConfig  # noqa: PLC0415 (the env kit imports without pydantic)

    settings = parse_spec(spec, EnvConfig())
    return generate_maze(settings.seed, settings.size, settings.start, settings.goal).layout_text()


def content_hash(specs: Sequence[TaskSpec]) -> str:
    """sha256 over every spec (canonical JSON) and its generated layout."""
    return hash_tasks(specs, content_text)


@functools.cache
def get_eval_set(name: str = "") -> EvalSet:
    """The eval set called `name` ("" = the default set); KeyError for an unknown name."""
    name = recipe_named(RECIPES, DEFAULT_EVAL_SET, name)
    return build_eval_set(name, RECIPES, get_eval_set, task_key, content_text)
