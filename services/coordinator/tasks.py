"""Which tasks a step plays: maze seeds drawn from (run seed, step), never an eval set's layout, and
their env options (exploring starts). Pure functions, so a replayed step plays the same episodes."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable

from services.common.conversation import Tokenizer
from services.common.maze import ACTIONS, TRAIN_SEED_LIMIT, is_eval_layout, layout_key, num_cells_per_side
from services.coordinator.config import EnvSettings
from services.coordinator.wire import TaskSpec


class ConfigRefused(ValueError):
    """The run config cannot run on these services (e.g. colocated mode without sleep support)."""


def step_seeds(run_seed: int, step: int, round_index: int, count: int, size: int,
               exclude_layouts: frozenset[bytes] = frozenset()) -> list[int]:
    """Maze seeds of one sampling round of a step, a pure function of its arguments: distinct
    training seeds whose layouts at `size` are neither reserved for eval sets nor in `exclude_layouts`."""
    rng = random.Random(f"mmrl:{run_seed}:{step}:{round_index}")
    seeds: list[int] = []
    for draws in itertools.count():
        if len(seeds) == count:
            break
        if draws == 1000 * count:  # e.g. a 2x2-cell maze has 4 layouts, and an eval set may hold them
            raise ConfigRefused(f"found {len(seeds)} of {count} training mazes in {draws} draws: at size {size} "
                                "nearly every layout is reserved for eval sets or in the run's eval set")
        seed = rng.randrange(TRAIN_SEED_LIMIT)
        key = layout_key(seed, size)
        if not is_eval_layout(key) and key not in exclude_layouts and seed not in seeds:
            seeds.append(seed)
    return seeds


def require_action_budget(tokenizer: Tokenizer, max_tokens: int) -> None:
    """Refuses a token budget too small for an action word, which would cut every such move to an
    invalid action: `sampling.max_tokens: 1` is right only where every action word is one token."""
    for word in ACTIONS:
        length = len(tokenizer.encode(word, add_special_tokens=False))
        if length > max_tokens:
            raise ConfigRefused(f"sampling.max_tokens {max_tokens} cannot hold the action {word!r}, "
                                f"{length} tokens with this model's tokenizer")


def spec_layouts(specs: Iterable[TaskSpec], default_size: int) -> frozenset[bytes]:
    """The layout keys of these mazes (a spec without a size option has the run's)."""
    return frozenset(layout_key(spec.seed, int(spec.options.get("size", default_size))) for spec in specs)


def training_options(env: EnvSettings, run_seed: int, step: int, round_index: int, maze_seed: int) -> dict[str, str]:
    """Env options of one training maze: the run's, and with `env.random_start` p, for a share p
    of the mazes, a start cell drawn uniformly among the cells other than the goal (exploring
    starts; all G episodes of the group start there). A pure function of its arguments, so a
    replayed step plays the same episodes."""
    options = env.spec_options()
    if env.random_start == 0.0:
        return options
    rng = random.Random(f"mmrl:{run_seed}:{step}:{round_index}:{maze_seed}:start")
    if rng.random() >= env.random_start:
        return options
    goal, side = env.goal_cell(), num_cells_per_side(env.size)
    cells = [(r, c) for r in range(side) for c in range(side) if (r, c) != goal]
    row, col = rng.choice(cells)
    return {**options, "start": f"{row},{col}"}
