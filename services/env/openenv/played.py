"""An OpenEnv environment played through EnvService (`mmrl serve env --openenv URL`): any OpenEnv server
whose action is a text field and whose observations carry text (and, where it has them, base64 images).

Each MMRL episode is one openenv-core client session (`GenericEnvClient`, WebSocket): CreateEpisodes
connects and resets with the spec's seed, Step sends `{action_field: text}`, CloseEpisodes closes the
session. The observation's text is its string fields (`images` aside) joined; its image is the first
base64 string of an `images` list (none: a text-only observation). done and reward are the server's; the move budget (`max_moves`,
default 20) is kept here: an episode it ends is truncated, as is one the server ends with
`truncated: true` in its observation. `info` passes the observation's `info` mapping on (MMRL's own
OpenEnv servers put solved, invalid and optimal_action there). Action words come from
`--action-words`; training seeds lie in [0, 1e6), the eval set `<name>-eval-64` is the seeds from 1e6.
OpenEnv has no options: a spec with any is refused. A server that fails a call fails the request
(UNAVAILABLE): an OpenEnv server must be reachable and give the same episode for the same seed.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from services.env.config import EnvConfig
from services.env.errors import EnvError, ErrorCode
from services.env.kit.batched import EnvInfo
from services.env.kit.seeded import SeedRangeEnv
from services.env.kit.spec import SpecLike, check_max_moves, check_options_and_seed

DEFAULT_MAX_MOVES = 20
MAX_LIVE_SESSIONS = 256


@dataclass(frozen=True)
class OpenEnvSource:
    url: str
    name: str
    action_words: tuple[str, ...]
    action_field: str = "message"
    max_moves: int = DEFAULT_MAX_MOVES


def split_observation(observation: dict[str, Any]) -> tuple[str, list[bytes]]:
    """(text, PNG images) of an OpenEnv observation: its string fields, its base64 `images`."""
    images = []
    for item in observation.get("images") or []:
        try:
            images.append(base64.b64decode(item, validate=True))
        except (binascii.Error, TypeError, ValueError):
            continue
    text = " ".join(v for k, v in observation.items() if isinstance(v, str) and k != "images")
    return text, images


class OpenEnvEpisode:
    """One OpenEnv session as an episode."""

    def __init__(self, source: OpenEnvSource, seed: int, budget: int) -> None:
        from openenv.core.generic_client import GenericEnvClient

        self.source, self.budget, self.moves = source, budget, 0
        self.client = GenericEnvClient(base_url=source.url).connect()
        self.static_info: tuple[tuple[str, Any], ...] = ()
        self._apply(_call(lambda: self.client.reset(seed=seed)), stepped=False)

    def _apply(self, result: Any, stepped: bool) -> None:
        obs = dict(result.observation or {})
        self.text_, self.images = split_observation(obs)
        self.reward = float(result.reward or 0.0) if stepped else 0.0
        info = obs.get("info")
        self.info: dict[str, Any] = dict(info) if isinstance(info, dict) else {}
        self.info["moves"] = self.moves
        ended = bool(result.done)
        self.done = ended or self.moves >= self.budget
        self.truncated = self.done and (not ended or bool(obs.get("truncated", False)))
        if self.done:
            self.client.close()

    def step(self, text: str) -> None:
        self.moves += 1
        self._apply(_call(lambda: self.client.step({self.source.action_field: text})), stepped=True)

    def text(self) -> str:
        return self.text_

    def frame(self) -> bytes:
        return self.images[0] if self.images else b""

    def state_key(self) -> str:
        return ""

    def dynamic_info(self) -> dict[str, Any]:
        return {k: v for k, v in self.info.items() if isinstance(v, (bool, int, float, str))}

    def close(self) -> None:
        if not self.done:
            self.client.close()


def _call(call: Any) -> Any:
    try:
        return call()
    except (RuntimeError, ConnectionError, OSError) as error:
        raise EnvError(ErrorCode.UNAVAILABLE, f"the OpenEnv server failed: {error}") from None


class OpenEnvEnv(SeedRangeEnv[tuple[int, int], OpenEnvEpisode]):
    """Episodes of an OpenEnv server, at most MAX_LIVE_SESSIONS at once."""

    def __init__(self, source: OpenEnvSource, config: EnvConfig | None = None) -> None:
        if not source.action_words:
            raise ValueError("an OpenEnv environment's actions are free text: name them with --action-words")
        config = config or EnvConfig()
        super().__init__(config.model_copy(update={"max_live_episodes": min(config.max_live_episodes,
                                                                              MAX_LIVE_SESSIONS)}))
        self.source = source
        self.eval_set_name, self.eval_max_moves = f"{source.name}-eval-{self.num_eval_tasks}", source.max_moves
        self.INFO = EnvInfo(name=source.name, actions=source.action_words, capabilities=(),
                            eval_sets=(self.eval_set_name,))

    def _prepare(self, spec: SpecLike, where: str) -> tuple[int, int]:
        check_options_and_seed(spec, (), where)
        return spec.seed, check_max_moves(spec, self.config.max_max_moves, where) or self.source.max_moves

    def _start(self, prepared: tuple[int, int]) -> OpenEnvEpisode:
        return OpenEnvEpisode(self.source, *prepared)

    def close(self, episode_ids: Any) -> int:
        for episode_id in episode_ids:
            episode = self.store.get(episode_id)
            if episode is not None:
                episode.close()
        return super().close(episode_ids)

    def _discard(self, episode: OpenEnvEpisode) -> None:
        episode.close()
