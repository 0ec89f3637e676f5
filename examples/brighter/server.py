"""A minimal complete MMRL environment: "which of two coloured squares is brighter?".

Each episode asks `rounds` questions (option, default 4), one per turn, alternating between a
text-only turn (the two brightnesses as numbers) and a turn of two 32x32 images (the left square,
then the right one). The answer is `left` or `right`: a correct one earns 1/rounds, a wrong or
unreadable one (info.invalid) 0. The episode ends after the last question (solved when every answer
was right), or truncated when `max_moves` (default: rounds) runs out first.

    python examples/brighter/server.py --port 50061
    mmrl env check 127.0.0.1:50061

Only the generated stubs (mmrl_proto.v1), grpcio, grpcio-health-checking, grpcio-reflection and Pillow.
"""

from __future__ import annotations

import argparse
import asyncio
import colorsys
import hashlib
import io
import json
import random
import re
import signal
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from PIL import Image

from mmrl_proto.v1 import env_pb2 as pb
from mmrl_proto.v1 import env_pb2_grpc

SERVICE = pb.DESCRIPTOR.services_by_name["EnvService"].full_name
ACTIONS = ("left", "right")
SIDE_PX = 32  # patch 8 x merge 2: 4 image tokens per square for the tiny model
EVAL_SET, EVAL_SIZE, EVAL_SEEDS = "brighter-32", 32, 1_000_000_000  # training seeds lie below EVAL_SEEDS
MAX_BATCH, MAX_LIVE, MAX_MOVES = 1024, 8192, 100
INVALID, NOT_FOUND, EXHAUSTED = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                                 grpc.StatusCode.RESOURCE_EXHAUSTED)
Context = grpc.aio.ServicerContext
T = TypeVar("T")


class Refused(Exception):
    """A request answered with a gRPC status code instead of a result."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse_spec(spec: pb.EpisodeSpec, where: str) -> tuple[int, int]:
    """(rounds, max_moves) of a spec; unknown options and impossible values are refused."""
    unknown = sorted(set(spec.options) - {"rounds"})
    if unknown:
        raise Refused(INVALID, f"{where}.options: unknown option {unknown[0]!r} (known: rounds)")
    text = spec.options.get("rounds", "4")
    if not text.isdigit() or not 1 <= int(text) <= 16:
        raise Refused(INVALID, f"{where}.options.rounds: a whole number in [1, 16], got {text!r}")
    if not 0 <= spec.max_moves <= MAX_MOVES:
        raise Refused(INVALID, f"{where}.max_moves: must be in [0, {MAX_MOVES}], got {spec.max_moves}")
    if spec.seed < 0:
        raise Refused(INVALID, f"{where}.seed: must be >= 0, got {spec.seed}")
    return int(text), spec.max_moves or int(text)


def questions(seed: int, rounds: int) -> list[tuple[tuple[int, ...], tuple[int, ...], str]]:
    """(left colour, right colour, answer) of every question, a pure function of the seed."""
    rng = random.Random(seed)
    drawn = []
    for _ in range(rounds):  # one hue, two values (HSV): the brighter square is unambiguous
        hue, values, answer = rng.random(), sorted(rng.sample(range(20, 101, 10), 2)), rng.choice(ACTIONS)
        dim_rgb, bright_rgb = (tuple(round(255 * c) for c in colorsys.hsv_to_rgb(hue, 0.8, v / 100))
                               for v in values)
        drawn.append((bright_rgb, dim_rgb, answer) if answer == "left" else (dim_rgb, bright_rgb, answer))
    return drawn


def png(rgb: tuple[int, ...]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (SIDE_PX, SIDE_PX), rgb).save(buffer, format="PNG")
    return buffer.getvalue()


@dataclass
class Episode:
    questions: list[tuple[tuple[int, ...], tuple[int, ...], str]]
    max_moves: int
    index: int = 0  # the question being asked, also the moves made
    num_correct: int = 0

    @property
    def terminated(self) -> bool:
        return self.index == len(self.questions)

    @property
    def done(self) -> bool:
        return self.terminated or self.index >= self.max_moves

    def step(self, text: str) -> tuple[float, str, bool]:
        """Answers the question with the last `left` or `right` of `text`: (reward, feedback, invalid)."""
        words = re.findall(r"\b(left|right)\b", text.lower())
        correct = bool(words) and words[-1] == self.questions[self.index][2]
        self.index += 1
        self.num_correct += correct
        feedback = "Correct. " if correct else "Wrong. " if words else "Invalid action. "
        return (1.0 / len(self.questions) if correct else 0.0), feedback, not words

    def fill(self, state: pb.EpisodeState, feedback: str = "") -> None:
        n = len(self.questions)
        state.done, state.truncated = self.done, self.done and not self.terminated
        state.info.update({"solved": self.num_correct == n, "moves": self.index,
                           "num_correct": self.num_correct})
        if state.done:
            state.observation.text = f"{feedback}Done: {self.num_correct} of {n} correct."
            return
        left, right, answer = self.questions[self.index]
        state.info.update({"optimal_action": answer})
        ask = f"{feedback}Question {self.index + 1} of {n}."
        if self.index % 2 == 0:  # a text-only turn
            state.observation.text = (f"{ask} Left square: brightness {sum(left)}. Right square: brightness "
                                      f"{sum(right)}. Which is brighter? Reply left or right.")
        else:  # a turn of two images
            for rgb in (left, right):
                state.observation.images.add(data=png(rgb), mime_type="image/png")
            state.observation.text = f"{ask} Left image, right image: which square is brighter?"


def eval_specs() -> list[pb.EpisodeSpec]:
    return [pb.EpisodeSpec(seed=EVAL_SEEDS + i, max_moves=4, options={"rounds": "4"})
            for i in range(EVAL_SIZE)]


class BrighterServicer(env_pb2_grpc.EnvServiceServicer):
    def __init__(self) -> None:
        self.episodes: dict[str, Episode] = {}

    async def GetEnvInfo(self, request: pb.GetEnvInfoRequest, context: Context) -> pb.EnvInfo:
        return pb.EnvInfo(name="brighter", actions=ACTIONS, capabilities=["oracle"], eval_sets=[EVAL_SET])

    async def GetTrainingTasks(
        self, request: pb.GetTrainingTasksRequest, context: Context
    ) -> pb.GetTrainingTasksResponse:
        def answer() -> pb.GetTrainingTasksResponse:
            if not 0 <= request.count <= MAX_BATCH:
                raise Refused(INVALID, f"count: must be in [0, {MAX_BATCH}], got {request.count}")
            probe = pb.EpisodeSpec(max_moves=request.max_moves, options=request.options)
            parse_spec(probe, "request")
            seeds = random.Random(f"train:{request.seed}").sample(range(EVAL_SEEDS), request.count)
            return pb.GetTrainingTasksResponse(specs=[pb.EpisodeSpec(
                seed=s, max_moves=request.max_moves, options=request.options) for s in seeds])
        return await self._answer(context, answer)

    async def GetEvalSet(self, request: pb.GetEvalSetRequest, context: Context) -> pb.GetEvalSetResponse:
        def answer() -> pb.GetEvalSetResponse:
            if request.name not in ("", EVAL_SET):
                raise Refused(NOT_FOUND, f"name: no eval set {request.name!r} (known: {EVAL_SET})")
            specs = eval_specs()
            content = [[s.seed, s.max_moves, dict(s.options), questions(s.seed, 4)] for s in specs]
            digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
            return pb.GetEvalSetResponse(name=EVAL_SET, version="v1", content_hash=digest, specs=specs)
        return await self._answer(context, answer)

    async def CreateEpisodes(
        self, request: pb.CreateEpisodesRequest, context: Context
    ) -> pb.CreateEpisodesResponse:
        def answer() -> pb.CreateEpisodesResponse:
            if len(request.specs) > MAX_BATCH:
                raise Refused(INVALID, f"specs: {len(request.specs)} items, more than {MAX_BATCH}")
            parsed = [parse_spec(spec, f"specs[{i}]") for i, spec in enumerate(request.specs)]
            if len(self.episodes) + len(parsed) > MAX_LIVE:
                raise Refused(EXHAUSTED, f"specs: more than {MAX_LIVE} live episodes; close finished ones")
            response = pb.CreateEpisodesResponse()
            for spec, (rounds, max_moves) in zip(request.specs, parsed, strict=True):
                episode_id = uuid.uuid4().hex
                self.episodes[episode_id] = Episode(questions(spec.seed, rounds), max_moves)
                state = response.episodes.add(episode_id=episode_id)
                self.episodes[episode_id].fill(state)
            return response
        return await self._answer(context, answer)

    async def Step(self, request: pb.StepRequest, context: Context) -> pb.StepResponse:
        def answer() -> pb.StepResponse:
            if len(request.actions) > MAX_BATCH:
                raise Refused(INVALID, f"actions: {len(request.actions)} items, more than {MAX_BATCH}")
            if len({a.episode_id for a in request.actions}) < len(request.actions):
                raise Refused(INVALID, "actions: an episode appears twice")
            for i, action in enumerate(request.actions):  # the whole batch is checked before any change
                episode = self.episodes.get(action.episode_id)
                if episode is None:
                    raise Refused(NOT_FOUND, f"actions[{i}]: no episode {action.episode_id[:40]!r}")
                if episode.done:
                    raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"actions[{i}]: the episode is done")
            response = pb.StepResponse()
            for action in request.actions:
                episode = self.episodes[action.episode_id]
                reward, feedback, invalid = episode.step(action.action)
                state = response.episodes.add(episode_id=action.episode_id, reward=reward)
                episode.fill(state, feedback)
                state.info.update({"invalid": invalid})
            return response
        return await self._answer(context, answer)

    async def CloseEpisodes(
        self, request: pb.CloseEpisodesRequest, context: Context
    ) -> pb.CloseEpisodesResponse:
        closed = sum(self.episodes.pop(episode_id, None) is not None for episode_id in request.episode_ids)
        return pb.CloseEpisodesResponse(num_closed=closed)

    async def _answer(self, context: Context, answer: Callable[[], T]) -> T:
        try:
            return answer()
        except Refused as refused:
            await context.abort(refused.code, str(refused))  # raises: the client gets the code
            raise


async def serve(address: str, servicer: env_pb2_grpc.EnvServiceServicer) -> None:
    server = grpc.aio.server()
    env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection([SERVICE, "grpc.health.v1.Health", reflection.SERVICE_NAME], server)
    server.add_insecure_port(address)
    await server.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=2)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the 'brighter' example environment")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50061)
    args = parser.parse_args()
    asyncio.run(serve(f"{args.host}:{args.port}", BrighterServicer()))
