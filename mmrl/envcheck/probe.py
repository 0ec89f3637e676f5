"""What every check talks to the env server through: `EnvProbe` (the EnvService calls, each answer
checked for the invariants every answer must keep) and `Context` (what several checks need, asked
once: the env's info, a training task, the default eval set).

A check fails by raising `CheckFailed(detail)`; a gRPC error that no check expected fails the check
with the call and its status (runner.py).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
from PIL import Image

from mmrl_proto.v1 import common_pb2, env_pb2, env_pb2_grpc
from services.common.grpc_server import channel

CHECK_SEED = "mmrl-env-check"
KNOWN_CAPABILITIES = ("state_keys", "oracle")
MIME_FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP", "image/gif": "GIF"}


class CheckFailed(Exception):
    """The env broke the contract; the message says how, in one line."""


def spec_key(spec: env_pb2.EpisodeSpec, with_budget: bool = True) -> tuple[object, ...]:
    """A spec as a hashable value: seed, options and (unless `with_budget` is False) max_moves."""
    options = tuple(sorted(spec.options.items()))
    return (spec.seed, options, spec.max_moves) if with_budget else (spec.seed, options)


def shown_spec(spec: env_pb2.EpisodeSpec) -> str:
    return f"seed={spec.seed} max_moves={spec.max_moves} options={dict(sorted(spec.options.items()))}"


def image_pixels(image: common_pb2.Image, where: str) -> tuple[tuple[int, int], bytes]:
    """(size, RGBA pixels) of an observation image; CheckFailed if it is empty, does not decode or
    is not in the format its mime_type names."""
    if not image.data:
        raise CheckFailed(f"{where}: an image without data")
    try:
        with Image.open(io.BytesIO(image.data)) as decoded:
            decoded.load()
            image_format, pixels = decoded.format, decoded.convert("RGBA")
    except Exception as error:  # noqa: BLE001 - any decoder error means the rollout cannot read it
        raise CheckFailed(f"{where}: an image that does not decode ({error})") from None
    expected = MIME_FORMATS.get(image.mime_type)
    if expected is None or expected != image_format:
        raise CheckFailed(f"{where}: mime_type {image.mime_type!r} for a {image_format} image "
                          f"(known: {', '.join(MIME_FORMATS)})")
    return pixels.size, pixels.tobytes()


def observation_of(state: env_pb2.EpisodeState) -> tuple[object, ...]:
    """What a caller sees of a state, images compared by their pixels (not their encoding)."""
    images = tuple(image_pixels(image, "observation") for image in state.observation.images)
    return (state.observation.text, images, state.reward, state.done, state.truncated, state.state_key)


def _check_states(method: str, states: Sequence[env_pb2.EpisodeState], ids: Sequence[str] | None) -> None:
    if ids is not None and [s.episode_id for s in states] != list(ids):
        wrong = sum(s.episode_id != i for s, i in zip(states, ids, strict=False)) + abs(len(states) - len(ids))
        raise CheckFailed(f"{method} answered {len(states)} states for {len(ids)} actions, {wrong} of them for "
                          "another episode (one state per action, in request order)")
    for state in states:
        if not math.isfinite(state.reward):
            raise CheckFailed(f"{method}: reward {state.reward} of episode {state.episode_id[:12]}")
        if state.truncated and not state.done:
            raise CheckFailed(f"{method}: episode {state.episode_id[:12]} is truncated but not done")


@dataclass
class EnvProbe:
    """The EnvService of one server, each call with a deadline; every episode it creates is closed
    by `close_all`."""

    address: str
    timeout_s: float
    channel: grpc.aio.Channel = field(init=False)
    stub: env_pb2_grpc.EnvServiceStub = field(init=False)
    created: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.channel = channel(self.address)
        self.stub = env_pb2_grpc.EnvServiceStub(self.channel)

    async def info(self) -> env_pb2.EnvInfo:
        return await self.stub.GetEnvInfo(env_pb2.GetEnvInfoRequest(), timeout=self.timeout_s)

    async def training_tasks(self, seed: str, count: int, max_moves: int = 0,
                             options: dict[str, str] | None = None) -> list[env_pb2.EpisodeSpec]:
        request = env_pb2.GetTrainingTasksRequest(seed=seed, count=count, max_moves=max_moves, options=options)
        return list((await self.stub.GetTrainingTasks(request, timeout=self.timeout_s)).specs)

    async def eval_set(self, name: str = "") -> env_pb2.GetEvalSetResponse:
        return await self.stub.GetEvalSet(env_pb2.GetEvalSetRequest(name=name), timeout=self.timeout_s)

    async def create(self, specs: Sequence[env_pb2.EpisodeSpec]) -> list[env_pb2.EpisodeState]:
        reply = await self.stub.CreateEpisodes(env_pb2.CreateEpisodesRequest(specs=specs), timeout=self.timeout_s)
        states = list(reply.episodes)
        self.created.update(s.episode_id for s in states)
        if len(states) != len(specs):
            raise CheckFailed(f"CreateEpisodes answered {len(states)} episodes for {len(specs)} specs")
        ids = [s.episode_id for s in states]
        if not all(ids) or len(set(ids)) != len(ids):
            raise CheckFailed("CreateEpisodes answered empty or repeated episode ids")
        _check_states("CreateEpisodes", states, None)
        return states

    async def step(self, actions: Sequence[tuple[str, str]]) -> list[env_pb2.EpisodeState]:
        request = env_pb2.StepRequest(actions=[env_pb2.EpisodeAction(episode_id=e, action=a) for e, a in actions])
        states = list((await self.stub.Step(request, timeout=self.timeout_s)).episodes)
        _check_states("Step", states, [episode_id for episode_id, _ in actions])
        return states

    async def close(self, episode_ids: Sequence[str]) -> int:
        reply = await self.stub.CloseEpisodes(env_pb2.CloseEpisodesRequest(episode_ids=episode_ids),
                                              timeout=self.timeout_s)
        self.created.difference_update(episode_ids)
        return int(reply.num_closed)

    async def close_all(self) -> None:
        ids = sorted(self.created)
        for start in range(0, len(ids), 256):
            await self.close(ids[start:start + 256])


async def status_of(call: object) -> grpc.StatusCode:
    """The status a call ends with (OK when it answers)."""
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def expect_status(what: str, got: grpc.StatusCode, *allowed: grpc.StatusCode) -> str:
    """`what -> CODE` when `got` is allowed, else CheckFailed naming what was expected."""
    if got not in allowed:
        raise CheckFailed(f"{what}: answered {got.name}, expected {' or '.join(code.name for code in allowed)}")
    return f"{what} -> {got.name}"


@dataclass
class Context:
    """What several checks need from the env, asked once (a failure is the check's failure)."""

    probe: EnvProbe
    _info: env_pb2.EnvInfo | None = None
    _task: env_pb2.EpisodeSpec | None = None

    async def info(self) -> env_pb2.EnvInfo:
        if self._info is None:
            self._info = await self.probe.info()
        return self._info

    async def task(self) -> env_pb2.EpisodeSpec:
        """A training task with the env's default options and budget."""
        if self._task is None:
            specs = await self.probe.training_tasks(CHECK_SEED, 1)
            if len(specs) != 1:
                raise CheckFailed(f"GetTrainingTasks(count=1) answered {len(specs)} tasks")
            self._task = specs[0]
        return self._task

    async def action(self, state: env_pb2.EpisodeState, turn: int) -> str:
        """The oracle's action where the env has one, else the env's action words in turn."""
        info = await self.info()
        oracle = state.info.fields.get("optimal_action")
        if "oracle" in info.capabilities and oracle is not None and oracle.string_value:
            return oracle.string_value
        return info.actions[turn % len(info.actions)]

    async def play(self, states: list[env_pb2.EpisodeState], max_turns: int,
                   same_actions_as: list[int] | None = None) -> list[list[env_pb2.EpisodeState]]:
        """Plays episodes in lockstep until done or `max_turns`; episode i plays the actions chosen for
        episode `same_actions_as[i]` (default: its own). Returns each episode's states, first included."""
        leaders = same_actions_as or list(range(len(states)))
        history = [[s] for s in states]
        for turn in range(max_turns):
            live = [i for i, h in enumerate(history) if not h[-1].done]
            if not live:
                break
            chosen = {i: await self.action(history[leaders[i]][-1], turn) for i in live}
            stepped = await self.probe.step([(history[i][-1].episode_id, chosen[i]) for i in live])
            for i, state in zip(live, stepped, strict=True):
                history[i].append(state)
        return history
