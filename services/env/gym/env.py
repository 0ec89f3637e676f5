"""`GymnasiumEnv`: a Gymnasium environment served as EnvService (`mmrl serve env --gymnasium ID`).

Every episode makes its own env (`gymnasium.make(id, render_mode="rgb_array", **kwargs)`) and resets
it with the spec's seed, so a spec always plays the same episode. Training seeds lie in
[0, TRAIN_SEED_LIMIT); the eval set `<name>-eval-<N>` (v1) is the seeds EVAL_SEED_MIN + i, i < N, of the
range reserved for eval sets (services/env/kit/seeds.py), so the two never share a seed. Small task
spaces (MiniGrid's 6x6 Empty room has 60 starts) still repeat a start across the ranges.

Options of a spec: `frame_px` (the frame's longer side, a multiple of 16 in [16, 512]; default the
source's). max_moves 0 means the source's budget. Declares `state_keys`, never `oracle`.
"""

from __future__ import annotations

import os
from typing import Any

from services.env.config import EnvConfig
from services.env.errors import invalid
from services.env.gym.episode import GymEpisode
from services.env.gym.presets import GymSource, action_names, import_registering_module
from services.env.kit.actions import word_parser
from services.env.kit.batched import EnvInfo
from services.env.kit.seeded import SeedRangeEnv
from services.env.kit.spec import SpecLike, check_max_moves, check_options_and_seed, int_option

OPTIONS = ("frame_px",)
MAX_FRAME_PX = 512


def make_env(source: GymSource, seed: int) -> Any:
    import gymnasium

    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # toy-text renders through pygame: no display wanted

    import_registering_module(source.env_id)
    return gymnasium.make(source.env_id, **source.make_kwargs(seed))


def check_source(source: GymSource) -> tuple[str, ...]:
    """The action words of `source`, after checking that its env renders frames and has a Discrete action
    space of at least that many actions; ValueError saying what is missing."""
    from gymnasium import spaces

    env = make_env(source, 0)
    try:
        if "rgb_array" not in env.metadata.get("render_modes", []):
            raise ValueError(f"{source.env_id} does not render rgb_array frames")
        if not isinstance(env.action_space, spaces.Discrete):
            raise ValueError(f"{source.env_id}: only Discrete action spaces are served, not {env.action_space}")
        words = source.action_words or action_names(env)
        if not words:
            raise ValueError(f"{source.env_id} names no actions: give --action-words w1,w2,...")
        if len(words) > int(env.action_space.n) or len(set(w.lower() for w in words)) != len(words):
            raise ValueError(f"action words {', '.join(words)}: at most {env.action_space.n} distinct words")
        if source.frame_px % 16 or not 16 <= source.frame_px <= MAX_FRAME_PX:
            raise ValueError(f"frame_px {source.frame_px}: a multiple of 16 in [16, {MAX_FRAME_PX}]")
        return tuple(words)
    finally:
        env.close()


class GymnasiumEnv(SeedRangeEnv[tuple[int, int, int], GymEpisode]):
    """Batched episodes of one Gymnasium environment."""

    def __init__(self, source: GymSource, config: EnvConfig | None = None) -> None:
        super().__init__(config)
        self.source = source
        words = check_source(source)
        self.parse = word_parser(words)
        self.eval_set_name, self.num_eval_tasks = f"{source.name}-eval-{source.num_eval_tasks}", source.num_eval_tasks
        self.eval_max_moves = source.max_moves
        self.INFO = EnvInfo(name=source.name, actions=words, capabilities=("state_keys",),
                            eval_sets=(self.eval_set_name,))

    def _prepare(self, spec: SpecLike, where: str) -> tuple[int, int, int]:
        """(seed, budget, frame_px) of a valid spec; INVALID_ARGUMENT naming the field otherwise."""
        check_options_and_seed(spec, OPTIONS, where)
        budget = check_max_moves(spec, self.config.max_max_moves, where) or self.source.max_moves
        frame_px = int_option(spec.options, "frame_px", self.source.frame_px, where, (16, MAX_FRAME_PX))
        if frame_px % 16:
            raise invalid(f"{where}.options.frame_px", f"must be a multiple of 16, got {frame_px}")
        return spec.seed, budget, frame_px

    def _start(self, prepared: tuple[int, int, int]) -> GymEpisode:
        seed, budget, frame_px = prepared
        return GymEpisode(make_env(self.source, seed), seed, budget, self.INFO.actions, self.parse, frame_px,
                          task=f"{self.source.name}/{seed}/{frame_px}")

    def _discard(self, episode: GymEpisode) -> None:
        episode.env.close()
