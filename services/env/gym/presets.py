"""What a Gymnasium environment is served as: its id, its make() kwargs, its action words, its frames
and budget (`GymSource`), from a preset name or a plain Gymnasium id (`resolve`).

Action words come from the env where it names its actions: an `actions` enum on the unwrapped env
(MiniGrid's `Actions`), `get_action_meanings()` (Atari through ale-py), or the directions of
Gymnasium's toy-text grids (FrozenLake's LEFT, DOWN, RIGHT, UP; CliffWalking's UP, RIGHT, DOWN, LEFT).
Otherwise `--action-words` names them. Word i is action i; fewer words than actions offer only the
first ones (MiniGrid's Empty rooms need left, right and forward, not pickup, drop, toggle or done).
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Env id prefix -> the module whose import registers those ids with Gymnasium.
REGISTERING_MODULES = {"MiniGrid-": "minigrid", "BabyAI-": "minigrid", "ALE/": "ale_py"}
# Gymnasium's toy-text grids name their actions as module constants, not on the env: by id family.
TOY_TEXT_ACTIONS = {"FrozenLake": ("left", "down", "right", "up"), "CliffWalking": ("up", "right", "down", "left")}
DEFAULT_FRAME_PX = 96
DEFAULT_MAX_MOVES = 20
DEFAULT_EVAL_TASKS = 64


@dataclass(frozen=True)
class GymSource:
    """A Gymnasium environment as the env service serves it."""

    name: str
    """GetEnvInfo's name: the preset's name, else the env id."""
    env_id: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """gymnasium.make() keyword arguments (render_mode is always rgb_array)."""
    action_words: tuple[str, ...] = ()
    """Word i is action i; empty: the env's own names (`action_names`)."""
    frame_px: int = DEFAULT_FRAME_PX
    """The longer side of every frame in pixels, a multiple of 16 (the tiny model's patch 8, merge 2)."""
    max_moves: int = DEFAULT_MAX_MOVES
    """The move budget of a spec that says 0."""
    num_eval_tasks: int = DEFAULT_EVAL_TASKS
    seed_kwargs: Callable[[int], dict[str, Any]] | None = None
    """make() kwargs that follow the spec's seed (e.g. a FrozenLake map drawn from it)."""

    def make_kwargs(self, seed: int) -> dict[str, Any]:
        return {**self.kwargs, **(self.seed_kwargs(seed) if self.seed_kwargs else {}), "render_mode": "rgb_array"}


def frozen_lake_map(seed: int, size: int = 4) -> dict[str, Any]:
    """A FrozenLake map of `size` x `size` drawn from `seed` (Gymnasium's generator: a path always exists)."""
    from gymnasium.envs.toy_text.frozen_lake import generate_random_map

    return {"desc": generate_random_map(size=size, seed=seed)}


PRESETS: dict[str, GymSource] = {
    # The agent's start cell and heading vary with the seed; the goal is the far corner. 48 px: 8 px a
    # cell of the 6x6 room (walls included), one patch of the tiny model's vision tower, 9 image tokens.
    "minigrid-empty-6x6": GymSource(
        name="minigrid-empty-6x6", env_id="MiniGrid-Empty-Random-6x6-v0", kwargs={"tile_size": 8},
        action_words=("left", "right", "forward"), frame_px=48, max_moves=12),
    # A new 4x4 map (holes and all) per seed, not slippery: the frame shows where the holes are. 32 px:
    # 8 px a cell, 4 image tokens.
    "frozenlake-4x4": GymSource(
        name="frozenlake-4x4", env_id="FrozenLake-v1", kwargs={"is_slippery": False}, frame_px=32, max_moves=10,
        seed_kwargs=frozen_lake_map),
}


def import_registering_module(env_id: str) -> None:
    """Imports the package that registers `env_id` with Gymnasium (MiniGrid, ale-py), if one is known."""
    for prefix, module in REGISTERING_MODULES.items():
        if env_id.startswith(prefix):
            importlib.import_module(module)


def action_names(env: Any) -> tuple[str, ...] | None:
    """The names the env gives its actions, lower case, in action order; None when it names none."""
    unwrapped = env.unwrapped
    if hasattr(unwrapped, "get_action_meanings"):
        return tuple(str(m).lower() for m in unwrapped.get_action_meanings())
    actions = getattr(unwrapped, "actions", None)
    if isinstance(actions, type) and issubclass(actions, enum.Enum):
        return tuple(a.name.lower() for a in actions)
    family = (env.spec.id if env.spec is not None else "").split("-")[0]
    return TOY_TEXT_ACTIONS.get(family)


def resolve(id_or_preset: str, kwargs: Mapping[str, Any] | None = None, action_words: str = "") -> GymSource:
    """The preset called `id_or_preset`, else the Gymnasium env of that id with defaults; `kwargs` are
    added to make()'s, `action_words` (comma-separated) replace the env's names."""
    words = tuple(w.strip() for w in action_words.split(",") if w.strip())
    base = PRESETS.get(id_or_preset) or GymSource(name=id_or_preset, env_id=id_or_preset)
    return GymSource(**{**base.__dict__, "kwargs": {**base.kwargs, **(kwargs or {})},
                        "action_words": words or base.action_words})
