"""The gRPC EnvService: a thin translation between protos and an `Environment` (`MazeEnv`, `SokobanEnv`).

A refused request is answered with `context.abort(code, message)` (INVALID_ARGUMENT, NOT_FOUND,
FAILED_PRECONDITION, RESOURCE_EXHAUSTED; see `environment.py`) and changes nothing; the server
keeps serving. Handlers do their CPU work inline on the event loop: a 256-episode step takes a few
milliseconds, and running them one at a time keeps every batch atomic without locks.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import struct_pb2

from mmrl_proto.v1 import env_pb2, env_pb2_grpc
from services.env import metrics
from services.env.errors import EnvError
from services.env.kit.batched import Environment, EpisodeView

SERVICE_NAME = env_pb2.DESCRIPTOR.services_by_name["EnvService"].full_name  # "mmrl.v1.EnvService"
PNG_MIME = "image/png"
log = logging.getLogger("mmrl.env")
T = TypeVar("T")


@functools.lru_cache(maxsize=4096)
def _static_info_struct(static_info: tuple[tuple[str, Any], ...]) -> bytes:
    """The serialised Struct of an episode's fixed info fields (shared by a GRPO group, reused each step)."""
    struct = struct_pb2.Struct()
    struct.update(dict(static_info))
    return struct.SerializeToString()


_VALUE_KIND = {bool: "bool_value", int: "number_value", float: "number_value", str: "string_value"}


def _set_fields(struct: struct_pb2.Struct, values: dict[str, Any]) -> None:
    """`struct.update(values)` for flat values and lists of numbers, about twice as fast."""
    fields = struct.fields
    for key, value in values.items():
        kind = _VALUE_KIND.get(type(value))
        if kind is None:
            fields[key].list_value.extend(value)
        else:
            setattr(fields[key], kind, value)


def fill_state(state: env_pb2.EpisodeState, episode: EpisodeView) -> None:
    """Writes `episode` into an empty EpisodeState in place (`response.episodes.add()`): building
    nested messages in place avoids the copies that constructor arguments make."""
    state.episode_id = episode.episode_id
    if episode.frame_png:  # a text-only observation has none
        image = state.observation.images.add()
        image.data = episode.frame_png
        image.mime_type = PNG_MIME
    state.observation.text = episode.text
    state.reward = episode.reward
    state.done = episode.done
    state.truncated = episode.truncated
    state.state_key = episode.state_key
    state.info.MergeFromString(_static_info_struct(episode.static_info))
    _set_fields(state.info, episode.dynamic_info)


class EnvServicer(env_pb2_grpc.EnvServiceServicer):
    """EnvService over one environment."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        metrics.track_live_episodes(lambda: len(env.store))

    async def _call(self, context: grpc.aio.ServicerContext, method: str, operation: Callable[[], T]) -> T:
        """Runs `operation`; an EnvError becomes the gRPC status it names (abort raises)."""
        try:
            return metrics.observe(method, operation)
        except EnvError as error:
            log.info("request refused", extra={"method": method, "code": error.code.name, "reason": error.message})
            await context.abort(getattr(grpc.StatusCode, error.code.name), error.message)
            raise AssertionError("context.abort returned") from error

    async def GetEnvInfo(self, request: env_pb2.GetEnvInfoRequest, context: grpc.aio.ServicerContext) -> env_pb2.EnvInfo:
        info = self.env.info()
        return env_pb2.EnvInfo(name=info.name, actions=info.actions, capabilities=info.capabilities,
                               eval_sets=info.eval_sets)

    async def GetTrainingTasks(
        self, request: env_pb2.GetTrainingTasksRequest, context: grpc.aio.ServicerContext
    ) -> env_pb2.GetTrainingTasksResponse:
        specs = await self._call(context, "GetTrainingTasks", lambda: self.env.training_tasks(
            request.seed, request.count, request.max_moves, dict(request.options)))
        return env_pb2.GetTrainingTasksResponse(specs=[
            env_pb2.EpisodeSpec(seed=spec.seed, max_moves=spec.max_moves, options=dict(spec.options)) for spec in specs])

    async def CreateEpisodes(
        self, request: env_pb2.CreateEpisodesRequest, context: grpc.aio.ServicerContext
    ) -> env_pb2.CreateEpisodesResponse:
        episodes = await self._call(context, "CreateEpisodes", lambda: self.env.create(request.specs))
        log.debug("created episodes", extra={"num_episodes": len(episodes), "num_live": len(self.env.store)})
        response = env_pb2.CreateEpisodesResponse()
        for episode in episodes:
            fill_state(response.episodes.add(), episode)
        return response

    async def Step(self, request: env_pb2.StepRequest, context: grpc.aio.ServicerContext) -> env_pb2.StepResponse:
        episodes = await self._call(context, "Step", lambda: self.env.step(request.actions))
        response = env_pb2.StepResponse()
        for episode in episodes:
            fill_state(response.episodes.add(), episode)
        return response

    async def CloseEpisodes(
        self, request: env_pb2.CloseEpisodesRequest, context: grpc.aio.ServicerContext
    ) -> env_pb2.CloseEpisodesResponse:
        num_closed = await self._call(context, "CloseEpisodes", lambda: self.env.close(request.episode_ids))
        return env_pb2.CloseEpisodesResponse(num_closed=num_closed)

    async def GetEvalSet(
        self, request: env_pb2.GetEvalSetRequest, context: grpc.aio.ServicerContext
    ) -> env_pb2.GetEvalSetResponse:
        eval_set = await self._call(context, "GetEvalSet", lambda: self.env.eval_set(request.name))
        return env_pb2.GetEvalSetResponse(
            name=eval_set.name,
            version=eval_set.version,
            content_hash=eval_set.content_hash,
            specs=[
                env_pb2.EpisodeSpec(seed=spec.seed, max_moves=spec.max_moves, options=dict(spec.options))
                for spec in eval_set.specs
            ],
        )
