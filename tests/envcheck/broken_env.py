"""Deliberately broken environments: the example env (examples/brighter/server.py) with one
behaviour broken per variant, and the `mmrl env check` check that must catch it."""

from __future__ import annotations

import asyncio
import importlib.util
import io
import random
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "brighter" / "server.py"


def load_example() -> ModuleType:
    """examples/brighter/server.py as a module (examples/ is no package: it is loaded by path)."""
    name = "brighter_example_server"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


example = load_example()
pb = example.pb
Servicer = example.BrighterServicer


class NoisyFrames(Servicer):  # type: ignore[misc,valid-type]
    """Frames carry a random pixel: the same actions do not give the same observations."""

    async def Step(self, request: Any, context: Any) -> Any:
        response = await super().Step(request, context)
        for state in response.episodes:
            for image in state.observation.images:
                frame = Image.open(io.BytesIO(image.data)).convert("RGB")
                frame.putpixel((0, 0), tuple(random.randrange(256) for _ in range(3)))
                buffer = io.BytesIO()
                frame.save(buffer, format="PNG")
                image.data = buffer.getvalue()
        return response


class TrainsOnEvalTasks(Servicer):  # type: ignore[misc,valid-type]
    """The first training task of every draw is a task of the eval set."""

    async def GetTrainingTasks(self, request: Any, context: Any) -> Any:
        response = await super().GetTrainingTasks(request, context)
        if response.specs:
            response.specs[0].seed = example.EVAL_SEEDS + sum(request.seed.encode()) % example.EVAL_SIZE
        return response


class CrashesOnBadAction(Servicer):  # type: ignore[misc,valid-type]
    """An action that is no action word raises instead of being an invalid move."""

    async def Step(self, request: Any, context: Any) -> Any:
        for action in request.actions:
            if action.action.strip().lower() not in example.ACTIONS:
                raise ValueError(f"cannot parse {action.action!r}")
        return await super().Step(request, context)


class IgnoresTurnLimit(Servicer):  # type: ignore[misc,valid-type]
    """Every episode runs until its questions are answered, whatever its move budget."""

    async def CreateEpisodes(self, request: Any, context: Any) -> Any:
        response = await super().CreateEpisodes(request, context)
        for state in response.episodes:
            self.episodes[state.episode_id].max_moves = 1000
        return response


class EndsAtItsBudget(Servicer):  # type: ignore[misc,valid-type]
    """Not broken: a task without a `rounds` option asks 3 questions, so with max_moves 3 it ends by itself
    on the budget's last move (terminated, not truncated, as the contract says)."""

    async def CreateEpisodes(self, request: Any, context: Any) -> Any:
        for spec in request.specs:
            if "rounds" not in spec.options:
                spec.options["rounds"] = "3"
        return await super().CreateEpisodes(request, context)


class TruncatesAnEndedTask(EndsAtItsBudget):
    """Reports truncated whenever the budget is spent, also when the task ended by itself on that move."""

    async def Step(self, request: Any, context: Any) -> Any:
        response = await super().Step(request, context)
        for state in response.episodes:
            episode = self.episodes.get(state.episode_id)
            if episode is not None and episode.index >= episode.max_moves:
                state.truncated = state.done
        return response


class CrashesOnUnknownEpisode(Servicer):  # type: ignore[misc,valid-type]
    """A Step on an unknown episode id raises (UNKNOWN) instead of answering NOT_FOUND."""

    async def Step(self, request: Any, context: Any) -> Any:
        for action in request.actions:
            _ = self.episodes[action.episode_id]  # KeyError
        return await super().Step(request, context)


class IgnoresUnknownOptions(Servicer):  # type: ignore[misc,valid-type]
    """Unknown options are dropped instead of refused: a misspelt setting would go unnoticed."""

    async def CreateEpisodes(self, request: Any, context: Any) -> Any:
        for spec in request.specs:
            for key in [k for k in spec.options if k != "rounds"]:
                del spec.options[key]
        return await super().CreateEpisodes(request, context)

    async def GetTrainingTasks(self, request: Any, context: Any) -> Any:
        for key in [k for k in request.options if k != "rounds"]:
            del request.options[key]
        return await super().GetTrainingTasks(request, context)


class UnboundedBatch(Servicer):  # type: ignore[misc,valid-type]
    """CreateEpisodes takes any number of specs at once, beyond every limit."""

    async def CreateEpisodes(self, request: Any, context: Any) -> Any:
        if len(request.specs) <= example.MAX_BATCH:
            return await super().CreateEpisodes(request, context)
        response = pb.CreateEpisodesResponse()
        for spec in request.specs:
            rounds, max_moves = example.parse_spec(spec, "spec")
            episode_id = uuid.uuid4().hex
            self.episodes[episode_id] = example.Episode(example.questions(spec.seed, rounds), max_moves)
            self.episodes[episode_id].fill(response.episodes.add(episode_id=episode_id))
        return response


class DriftingEvalSet(Servicer):  # type: ignore[misc,valid-type]
    """Every GetEvalSet answers another content hash."""

    calls = 0

    async def GetEvalSet(self, request: Any, context: Any) -> Any:
        response = await super().GetEvalSet(request, context)
        self.calls += 1
        response.content_hash = f"{response.content_hash[:56]}{self.calls:08d}"
        return response


class NoOracle(Servicer):  # type: ignore[misc,valid-type]
    """Declares the capability oracle but never names info.optimal_action."""

    async def CreateEpisodes(self, request: Any, context: Any) -> Any:
        return self._without_oracle(await super().CreateEpisodes(request, context))

    async def Step(self, request: Any, context: Any) -> Any:
        return self._without_oracle(await super().Step(request, context))

    @staticmethod
    def _without_oracle(response: Any) -> Any:
        for state in response.episodes:
            if "optimal_action" in state.info.fields:
                del state.info.fields["optimal_action"]
        return response


class SharedRequestRace(Servicer):  # type: ignore[misc,valid-type]
    """Keeps the request being served on the servicer across an await: concurrent Steps answer each
    other's episodes."""

    async def Step(self, request: Any, context: Any) -> Any:
        self.current = request
        await asyncio.sleep(0.002)
        return await super().Step(self.current, context)


# variant -> (servicer class, the check that must fail)
VARIANTS: dict[str, tuple[type, str]] = {
    "noisy-frames": (NoisyFrames, "determinism"),
    "trains-on-eval-tasks": (TrainsOnEvalTasks, "training-not-eval"),
    "crashes-on-bad-action": (CrashesOnBadAction, "bad-actions"),
    "ignores-turn-limit": (IgnoresTurnLimit, "turn-limit"),
    "truncates-an-ended-task": (TruncatesAnEndedTask, "turn-limit"),
    "crashes-on-unknown-episode": (CrashesOnUnknownEpisode, "unknown-episode"),
    "ignores-unknown-options": (IgnoresUnknownOptions, "bad-spec"),
    "unbounded-batch": (UnboundedBatch, "oversized-batch"),
    "drifting-eval-set": (DriftingEvalSet, "eval-sets"),
    "no-oracle": (NoOracle, "oracle"),
    "shared-request-race": (SharedRequestRace, "concurrency"),
}
