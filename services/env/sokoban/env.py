"""`SokobanEnv`: the in-process EnvService of Sokoban (batched episodes; `mmrl serve env --env sokoban`).

Options of a spec (all values are strings, as in the proto's map):
  size     room side in cells, in [MIN_SIZE, MAX_SIZE] = [3, 12] (default "5": 80x80 px frames)
  pulls    most reverse-play pulls of the level's generation, 1..20 (default "4"; more: longer pushes)
  unit_px  pixels per cell (default "16": one image token per cell for patch 8, merge 2); the frame
           side size * unit_px must not exceed the config's max_frame_px
  reward   "sparse" (default: 1.0 on the solving push), "progress" (plus the share of the way to the
           solution each move covers, by the oracle's moves to solve) or "paced" (progress less one
           move's share a turn; services/env/kit/reward.py)
Seeds must be in [0, 2**53); max_moves 0 means DEFAULT_MAX_MOVES. Unknown options are refused.
The env's limits (live episodes, batch, action text, largest budget, frame cache) are EnvConfig's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from services.common.task import TaskSpec
from services.env.errors import invalid
from services.env.kit.batched import BatchedEnv, EnvInfo, named_eval_set
from services.env.kit.evalset import EvalSet
from services.env.kit.reward import RewardMode, reward_option
from services.env.kit.seeds import draw_training_seeds
from services.env.kit.spec import SpecLike, check_max_moves, check_options_and_seed, int_option
from services.env.sokoban.episode import SokobanEpisode, Task
from services.env.sokoban.evalset import RECIPES, get_eval_set
from services.env.sokoban.level import (
    DEFAULT_PULLS,
    DEFAULT_SIZE,
    MAX_SIZE,
    MIN_SIZE,
    generate_level,
    is_eval_level,
    level_key,
)
from services.env.sokoban.render import SokobanRenderer, frame_side
from services.env.sokoban.solver import Solution

OPTIONS = ("pulls", "reward", "size", "unit_px")
ACTIONS = ("up", "down", "left", "right")
DEFAULT_UNIT_PX = 16
DEFAULT_MAX_MOVES = 20
MAX_PULLS = 20


@dataclass(frozen=True)
class SokobanSettings:
    """A validated spec."""

    seed: int
    size: int
    pulls: int
    unit_px: int
    max_moves: int
    reward: RewardMode = "sparse"


@functools.lru_cache(maxsize=1024)
def load_task(seed: int, size: int, pulls: int, unit_px: int, cache: bool, cache_bytes: int) -> Task:
    """The level, oracle and renderer of a task, shared by the episodes of a GRPO group while cached."""
    level = generate_level(seed, size, pulls)
    return Task(level=level, solution=Solution.of(level),
                renderer=SokobanRenderer(level, unit_px, cache=cache, cache_bytes=cache_bytes))


class SokobanEnv(BatchedEnv[SokobanSettings, SokobanEpisode]):
    """Batched Sokoban episodes with a bounded live set, idle expiry and a cache of recent levels."""

    INFO = EnvInfo(name="sokoban", actions=ACTIONS, capabilities=("state_keys", "oracle"),
                   eval_sets=tuple(RECIPES))

    def _prepare(self, spec: SpecLike, where: str) -> SokobanSettings:
        """Validates `spec`; EnvError(INVALID_ARGUMENT) naming the field, e.g. `specs[3].options.size`."""
        options = spec.options
        check_options_and_seed(spec, OPTIONS, where)
        check_max_moves(spec, self.config.max_max_moves, where)
        size = int_option(options, "size", DEFAULT_SIZE, where, (MIN_SIZE, MAX_SIZE))
        pulls = int_option(options, "pulls", DEFAULT_PULLS, where, (1, MAX_PULLS))
        unit_px = int_option(options, "unit_px", DEFAULT_UNIT_PX, where, (1, self.config.max_unit_px))
        side = frame_side(size, unit_px)
        if side > self.config.max_frame_px:
            raise invalid(f"{where}.options.unit_px", f"size {size} at unit_px {unit_px} makes {side}x{side} px "
                                                      f"frames, more than max_frame_px={self.config.max_frame_px}")
        return SokobanSettings(seed=spec.seed, size=size, pulls=pulls, unit_px=unit_px,
                               max_moves=spec.max_moves or DEFAULT_MAX_MOVES, reward=reward_option(options, where))

    def _start(self, prepared: SokobanSettings) -> SokobanEpisode:
        task = load_task(prepared.seed, prepared.size, prepared.pulls, prepared.unit_px,
                         self.config.frame_cache, self.config.frame_cache_bytes)
        return SokobanEpisode(task, prepared.max_moves, prepared.reward)

    def training_tasks(self, seed: str, count: int, max_moves: int, options: dict[str, str]) -> list[TaskSpec]:
        """`count` training levels drawn from `seed`: distinct levels, none reserved for eval sets;
        INVALID_ARGUMENT for options or a budget a spec could not have."""
        self.check_count(count)
        settings = self._prepare(TaskSpec(seed=0, max_moves=max_moves, options=dict(options)), "request")

        @functools.cache  # each candidate's level is generated once
        def key(candidate: int) -> bytes:
            return level_key(generate_level(candidate, settings.size, settings.pulls))

        try:
            seeds = draw_training_seeds(seed, count, reserved=lambda s: is_eval_level(key(s)), identity=key)
        except ValueError as error:
            raise invalid("count", f"{error} at size {settings.size}") from None
        return [TaskSpec(seed=s, max_moves=max_moves, options=dict(options)) for s in seeds]

    def eval_set(self, name: str = "") -> EvalSet:
        """The named eval set ("" = default); NOT_FOUND for an unknown name."""
        return named_eval_set(get_eval_set, name)
