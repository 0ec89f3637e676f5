"""`MazeEnv`: the in-process implementation of the EnvService contract for mazes (batched episodes).

The gRPC servicer is a thin translation layer over this class; tests and the benchmark use it
directly. The batch bookkeeping (validation before any change, the live set, idle expiry) is
`BatchedEnv`'s (services/env/kit/batched.py); this module adds what is maze-specific: specs, the cache
of recent mazes and their renderers, training tasks and eval sets.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from services.common.task import TaskSpec
from services.env.errors import invalid
from services.env.kit.batched import ActionLike, BatchedEnv, EnvInfo, EpisodeView, named_eval_set, view
from services.env.kit.evalset import EvalSet
from services.env.kit.spec import SpecLike
from services.env.maze.episode import Episode
from services.env.maze.evalset import RECIPES, get_eval_set
from services.env.maze.maze import ACTIONS, generate_maze
from services.env.maze.render import MazeRenderer
from services.env.maze.spec import EpisodeSettings, parse_spec
from services.env.maze.tasks import draw_training_seeds

if TYPE_CHECKING:  # the env kit imports without pydantic: the tiny model's tokenizer reads env words
    from services.env.config import EnvConfig

__all__ = ["ActionLike", "EnvInfo", "EpisodeView", "MazeEnv", "view"]


class MazeEnv(BatchedEnv[EpisodeSettings, Episode]):
    """Batched maze episodes with a bounded live set, idle expiry and a cache of recent mazes."""

    INFO = EnvInfo(name="maze", actions=ACTIONS, capabilities=("state_keys", "oracle"),
                   eval_sets=tuple(RECIPES))

    def __init__(self, config: EnvConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(config, clock)
        self._renderers: OrderedDict[tuple[int, int, tuple[int, int], tuple[int, int], int], MazeRenderer] = (
            OrderedDict()
        )

    def _prepare(self, spec: SpecLike, where: str) -> EpisodeSettings:
        return parse_spec(spec, self.config, where)

    def _start(self, prepared: EpisodeSettings) -> Episode:
        renderer = self._renderer(prepared)
        return Episode(prepared, renderer.maze, renderer)

    def training_tasks(self, seed: str, count: int, max_moves: int, options: dict[str, str]) -> list[TaskSpec]:
        """`count` distinct training mazes drawn from `seed` (services/env/maze/tasks.py), each with these
        options and move budget; INVALID_ARGUMENT for options or a budget a spec could not have."""
        self.check_count(count)
        probe = TaskSpec(seed=0, max_moves=max_moves, options=dict(options))
        size = parse_spec(probe, self.config, "request").size  # the options and budget, checked
        try:
            seeds = draw_training_seeds(seed, count, size)
        except ValueError as error:
            raise invalid("count", str(error)) from None
        return [TaskSpec(seed=s, max_moves=max_moves, options=dict(options)) for s in seeds]

    def eval_set(self, name: str = "") -> EvalSet:
        """The named eval set ("" = default); NOT_FOUND for an unknown name."""
        return named_eval_set(get_eval_set, name)

    def _renderer(self, settings: EpisodeSettings) -> MazeRenderer:
        """The maze and renderer of `settings`, shared by every episode of the same task while cached."""
        key = settings.maze_key
        renderer = self._renderers.get(key)
        if renderer is not None:
            self._renderers.move_to_end(key)
            return renderer
        maze = generate_maze(settings.seed, settings.size, settings.start, settings.goal)
        renderer = MazeRenderer(maze, settings.unit_px, cache=self.config.frame_cache,
                                cache_bytes=self.config.frame_cache_bytes)
        if self.config.maze_cache_size > 0:
            self._renderers[key] = renderer
            while len(self._renderers) > self.config.maze_cache_size:
                self._renderers.popitem(last=False)
        return renderer
