"""What every environment of the env service shares: the `Environment` protocol the gRPC servicer
serves, and `BatchedEnv`, the batched episode bookkeeping (create, step, close) over any episode type.

An environment (`MazeEnv`, `SokobanEnv`) subclasses `BatchedEnv` and supplies how a spec becomes an
episode (`_prepare`, which validates and must not change anything, then `_start`), its training tasks
and its eval sets. Every method validates the whole batch before changing anything, so a refused
request (`EnvError`, carrying the status code to answer with) leaves every episode as it was.
Not thread-safe: the grpc.aio server calls it from one event loop.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from services.common.messages import shown
from services.common.task import TaskSpec
from services.env.errors import EnvError, ErrorCode, invalid
from services.env.kit.evalset import EvalSet
from services.env.kit.spec import SpecLike
from services.env.store import EpisodeStore

if TYPE_CHECKING:  # the env kit imports without pydantic: the tiny model's tokenizer reads env words
    from services.env.config import EnvConfig


class ActionLike(Protocol):
    """One action of a Step batch; `mmrl_proto.v1.env_pb2.EpisodeAction` is one."""

    @property
    def episode_id(self) -> str: ...
    @property
    def action(self) -> str: ...


class EpisodeLike(Protocol):
    """One episode as a state machine (the maze's `Episode`, Sokoban's `SokobanEpisode`)."""

    done: bool
    truncated: bool
    reward: float
    static_info: tuple[tuple[str, Any], ...]

    def step(self, text: str) -> None: ...
    def text(self) -> str: ...
    def frame(self) -> bytes: ...
    def state_key(self) -> str: ...
    def dynamic_info(self) -> dict[str, Any]: ...


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
        """The whole info map (the fields each environment documents)."""
        return {**self.dynamic_info, **dict(self.static_info)}


def view(episode_id: str, episode: EpisodeLike) -> EpisodeView:
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


class Environment(Protocol):
    """The in-process EnvService contract the servicer translates to gRPC."""

    store: EpisodeStore[Any]

    def create(self, specs: Sequence[SpecLike]) -> list[EpisodeView]: ...
    def step(self, actions: Sequence[ActionLike]) -> list[EpisodeView]: ...
    def close(self, episode_ids: Sequence[str]) -> int: ...
    def info(self) -> EnvInfo: ...
    def training_tasks(self, seed: str, count: int, max_moves: int,
                       options: dict[str, str]) -> list[TaskSpec]: ...
    def eval_set(self, name: str = "") -> EvalSet: ...


Prepared = TypeVar("Prepared")
E = TypeVar("E", bound=EpisodeLike)


class BatchedEnv(Generic[Prepared, E]):
    """Batched episodes with a bounded live set and idle expiry; subclasses define the episodes."""

    INFO: EnvInfo

    def __init__(self, config: EnvConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        from services.env.config import EnvConfig  # noqa: PLC0415 (see the import above)

        self.config = config or EnvConfig()
        self.store: EpisodeStore[E] = EpisodeStore(self.config.max_live_episodes, self.config.idle_ttl_s, clock=clock)

    def _prepare(self, spec: SpecLike, where: str) -> Prepared:
        """The validated settings of one spec; EnvError(INVALID_ARGUMENT) naming the field at `where`."""
        raise NotImplementedError

    def _start(self, prepared: Prepared) -> E:
        """A new episode of validated settings."""
        raise NotImplementedError

    def info(self) -> EnvInfo:
        return self.INFO

    def create(self, specs: Sequence[SpecLike]) -> list[EpisodeView]:
        """One new episode per spec, each with its first observation."""
        self.check_batch("specs", len(specs))
        settings = [self._prepare(spec, f"specs[{i}]") for i, spec in enumerate(specs)]
        free = self.store.free_slots()
        if len(settings) > free:
            raise EnvError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"specs: cannot create {len(settings)} episodes, {len(self.store)} of "
                f"max_live_episodes={self.store.max_live} are live; close finished episodes",
            )
        views = []
        for one in settings:
            episode = self._start(one)
            episode_id = uuid.uuid4().hex
            self.store.add(episode_id, episode)
            views.append(view(episode_id, episode))
        return views

    def step(self, actions: Sequence[ActionLike]) -> list[EpisodeView]:
        """Applies one action text to each listed episode (each episode at most once per batch)."""
        self.check_batch("actions", len(actions))
        self.store.expire()
        episodes: list[E] = []
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
        self.check_batch("episode_ids", len(episode_ids))
        self.store.expire()
        return sum(self.store.close(episode_id) for episode_id in episode_ids)

    def check_batch(self, field: str, num_items: int) -> None:
        if num_items > self.config.max_batch:
            raise invalid(field, f"{num_items} items, more than max_batch={self.config.max_batch}")

    def check_count(self, count: int) -> None:
        """Refuses a GetTrainingTasks count out of bounds."""
        self.check_batch("count", count)
        if count < 0:
            raise invalid("count", f"must be >= 0, got {count}")


def named_eval_set(get: Callable[[str], EvalSet], name: str) -> EvalSet:
    """`get(name)`, its KeyError for an unknown name answered as NOT_FOUND."""
    try:
        return get(name)
    except KeyError as error:
        raise EnvError(ErrorCode.NOT_FOUND, f"name: {error.args[0]}") from None
