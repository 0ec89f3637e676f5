"""`MazeEnv`: the in-process implementation of the EnvService contract (batched episodes).

The gRPC servicer is a thin translation layer over this class; tests and the benchmark use it
directly. Every method validates the whole batch before changing anything, so a refused request
(`EnvError`, carrying the status code to answer with) leaves every episode as it was.
Not thread-safe: the grpc.aio server calls it from one event loop.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from services.common.maze import ACTIONS, generate_maze
from services.common.messages import shown
from services.env.config import EnvConfig
from services.env.episode import Episode
from services.env.errors import EnvError, ErrorCode, invalid
from services.env.evalset import RECIPES, EvalSet, get_eval_set
from services.env.render import MazeRenderer
from services.env.spec import EpisodeSettings, EpisodeSpec, SpecLike, parse_spec
from services.env.store import EpisodeStore
from services.env.tasks import draw_training_seeds


class ActionLike(Protocol):
    """One action of a Step batch; `mmrl.v1.env_pb2.EpisodeAction` is one."""

    @property
    def episode_id(self) -> str: ...
    @property
    def action(self) -> str: ...


@dataclass(frozen=True)
class EpisodeView:
    """What a caller sees of an episode after create or step (mirrors the proto's EpisodeState)."""

    episode_id: str
    frame_png: bytes
    text: str
    reward: float
    done: bool
    truncated: bool
    state_key: str
    static_info: tuple[tuple[str, Any], ...]
    """Info fields fixed for the episode (hashable)."""
    dynamic_info: dict[str, Any]
    """Info fields that change with each step."""

    @property
    def info(self) -> dict[str, Any]:
        """The whole info map: solved, moves, optimal_moves, max_moves, feedback, last_action, invalid,
        wall_bump, seed, size, require_stop, position, goal, moves_to_goal, optimal_action."""
        return {**self.dynamic_info, **dict(self.static_info)}


def view(episode_id: str, episode: Episode) -> EpisodeView:
    return EpisodeView(
        episode_id=episode_id, frame_png=episode.frame(), text=episode.text(),
        reward=episode.reward, done=episode.done, truncated=episode.truncated, state_key=episode.state_key(),
        static_info=episode.static_info,
        dynamic_info=episode.dynamic_info(),
    )


@dataclass(frozen=True)
class EnvInfo:
    """What GetEnvInfo answers (mirrors the proto's EnvInfo)."""

    name: str
    actions: tuple[str, ...]
    capabilities: tuple[str, ...]
    eval_sets: tuple[str, ...]


class MazeEnv:
    """Batched maze episodes with a bounded live set, idle expiry and a cache of recent mazes."""

    INFO = EnvInfo(name="maze", actions=ACTIONS, capabilities=("state_keys", "oracle"),
                   eval_sets=tuple(RECIPES))

    def __init__(self, config: EnvConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or EnvConfig()
        self.store: EpisodeStore[Episode] = EpisodeStore(
            self.config.max_live_episodes, self.config.idle_ttl_s, clock=clock
        )
        self._renderers: OrderedDict[tuple[int, int, tuple[int, int], tuple[int, int], int], MazeRenderer] = (
            OrderedDict()
        )

    def create(self, specs: Sequence[SpecLike]) -> list[EpisodeView]:
        """One new episode per spec, each with its first observation."""
        self._check_batch("specs", len(specs))
        settings = [parse_spec(spec, self.config, f"specs[{i}]") for i, spec in enumerate(specs)]
        free = self.store.free_slots()
        if len(settings) > free:
            raise EnvError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"specs: cannot create {len(settings)} episodes, {len(self.store)} of "
                f"max_live_episodes={self.store.max_live} are live; close finished episodes",
            )
        views = []
        for one in settings:
            renderer = self._renderer(one)
            episode = Episode(one, renderer.maze, renderer)
            episode_id = uuid.uuid4().hex
            self.store.add(episode_id, episode)
            views.append(view(episode_id, episode))
        return views

    def step(self, actions: Sequence[ActionLike]) -> list[EpisodeView]:
        """Applies one action text to each listed episode (each episode at most once per batch)."""
        self._check_batch("actions", len(actions))
        self.store.expire()
        episodes: list[Episode] = []
        seen: dict[str, int] = {}
        for i, item in enumerate(actions):
            if len(item.action) > self.config.max_action_chars:
                raise invalid(
                    f"actions[{i}].action",
                    f"{len(item.action)} characters, more than max_action_chars={self.config.max_action_chars}",
                )
            if item.episode_id in seen:
                raise invalid(f"actions[{i}].episode_id", f"same episode as actions[{seen[item.episode_id]}]")
            seen[item.episode_id] = i
            episode = self.store.get(item.episode_id)
            if episode is None:
                raise EnvError(ErrorCode.NOT_FOUND, f"actions[{i}].episode_id: {self.store.why_missing(item.episode_id)}")
            if episode.done:
                raise EnvError(
                    ErrorCode.FAILED_PRECONDITION,
                    f"actions[{i}].episode_id: episode {shown(item.episode_id)} is done; create a new one",
                )
            episodes.append(episode)
        views = []
        for item, episode in zip(actions, episodes, strict=True):
            episode.step(item.action)
            self.store.touch(item.episode_id)
            views.append(view(item.episode_id, episode))
        return views

    def close(self, episode_ids: Sequence[str]) -> int:
        """Forgets the listed episodes; unknown ids are ignored. Returns how many were live."""
        self._check_batch("episode_ids", len(episode_ids))
        self.store.expire()
        return sum(self.store.close(episode_id) for episode_id in episode_ids)

    def info(self) -> EnvInfo:
        return self.INFO

    def training_tasks(self, seed: str, count: int, max_moves: int, options: dict[str, str]) -> list[EpisodeSpec]:
        """`count` distinct training mazes drawn from `seed` (services/env/tasks.py), each with these
        options and move budget; INVALID_ARGUMENT for options or a budget a spec could not have."""
        self._check_batch("count", count)
        if count < 0:
            raise invalid("count", f"must be >= 0, got {count}")
        probe = EpisodeSpec(seed=0, max_moves=max_moves, options=dict(options))
        size = parse_spec(probe, self.config, "request").size  # the options and budget, checked
        try:
            seeds = draw_training_seeds(seed, count, size)
        except ValueError as error:
            raise invalid("count", str(error)) from None
        return [EpisodeSpec(seed=s, max_moves=max_moves, options=dict(options)) for s in seeds]

    def eval_set(self, name: str = "") -> EvalSet:
        """The named eval set ("" = default); NOT_FOUND for an unknown name."""
        try:
            return get_eval_set(name)
        except KeyError as error:
            raise EnvError(ErrorCode.NOT_FOUND, f"name: {error.args[0]}") from None

    def _check_batch(self, field: str, num_items: int) -> None:
        if num_items > self.config.max_batch:
            raise invalid(field, f"{num_items} items, more than max_batch={self.config.max_batch}")

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
