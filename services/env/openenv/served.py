"""An MMRL environment as an OpenEnv environment (`mmrl serve openenv --env NAME`), for the trainers that
speak OpenEnv (TRL, SkyRL, ART, torchforge).

Each OpenEnv session holds one episode of its own MMRL environment:
- reset(seed=None, max_moves=0, options=None): the task of that seed (a training task drawn afresh when
  no seed is given), max_moves and options as in an `EpisodeSpec` (docs/environments.md);
- step(MmrlAction(message=TEXT)): the action text, parsed by the environment as over EnvService;
- MmrlObservation: `text`, `images` (base64 PNG), `done`, `reward` (this step's), `truncated` (the
  budget ran out, not the task) and `info` (solved, moves, invalid, optimal_action where the env has an
  oracle). A refused spec or a step after the end raises ValueError: openenv-core answers it as an error.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from services.common.task import TaskSpec
from services.env.errors import EnvError
from services.env.kit.batched import Environment as MmrlEnvironment
from services.env.kit.batched import EpisodeView

DEFAULT_MAX_SESSIONS = 256


class MmrlAction(Action):
    message: str = Field(..., description="The action text (the env's parser reads it, e.g. 'up').")


class MmrlObservation(Observation):
    text: str = Field("", description="What the observation says.")
    images: list[str] = Field(default_factory=list, description="The observation's frames, base64 PNG.")
    truncated: bool = Field(False, description="Done because the move budget ran out, not the task.")
    info: dict[str, Any] = Field(default_factory=dict, description="solved, moves, invalid, optimal_action, ...")


@dataclass(frozen=True)
class _Act:
    episode_id: str
    action: str


def observation(view: EpisodeView) -> MmrlObservation:
    return MmrlObservation(text=view.text, images=[base64.b64encode(view.frame_png).decode()], done=view.done,
                           reward=view.reward, truncated=view.truncated, info=view.info)


def environment_class(make: Callable[[], MmrlEnvironment]) -> type[Environment]:
    """The OpenEnv `Environment` class whose sessions each play an episode of an env `make()` builds."""

    class MmrlOpenEnv(Environment):  # type: ignore[misc]
        SUPPORTS_CONCURRENT_SESSIONS = True  # every session has its own MMRL env object

        def __init__(self) -> None:
            super().__init__()
            self.env = make()
            self.episode_id = ""
            self._state = State(episode_id=None, step_count=0)

        def reset(self, seed: int | None = None, episode_id: str | None = None, max_moves: int = 0,
                  options: dict[str, str] | None = None, **kwargs: Any) -> MmrlObservation:
            self.close()
            if seed is None:
                (task,) = self.env.training_tasks(uuid.uuid4().hex, 1, max_moves, dict(options or {}))
                seed = task.seed
            try:
                (view,) = self.env.create([TaskSpec(seed=seed, max_moves=max_moves, options=dict(options or {}))])
            except EnvError as error:
                raise ValueError(error.message) from None
            self.episode_id = view.episode_id
            self._state = State(episode_id=episode_id or view.episode_id, step_count=0, seed=seed)
            return observation(view)

        def step(self, action: MmrlAction, timeout_s: float | None = None, **kwargs: Any) -> MmrlObservation:
            if not self.episode_id:
                raise ValueError("no episode: reset first")
            try:
                (view,) = self.env.step([_Act(self.episode_id, action.message)])
            except EnvError as error:
                raise ValueError(error.message) from None
            self._state.step_count += 1
            return observation(view)

        @property
        def state(self) -> State:
            return self._state

        def close(self) -> None:
            if self.episode_id:
                self.env.close([self.episode_id])
                self.episode_id = ""

    return MmrlOpenEnv


def create_app(make: Callable[[], MmrlEnvironment], max_sessions: int = DEFAULT_MAX_SESSIONS) -> Any:
    """openenv-core's FastAPI app (HTTP and WebSocket) serving the env `make()` builds, a session each."""
    from openenv.core.env_server.http_server import create_fastapi_app

    return create_fastapi_app(environment_class(make), MmrlAction, MmrlObservation, max_concurrent_envs=max_sessions)
