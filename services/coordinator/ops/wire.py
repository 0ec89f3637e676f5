"""What the coordinator sends to and gets from the services, as plain frozen dataclasses.

The clients (clients.py) own the generated protobuf types and convert at the edge, so the run loop,
the episode player, the evaluation and hindsight read and build these instead of `*_pb2` messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.common.task import TaskSpec


@dataclass(frozen=True)
class EvalSet:
    name: str
    version: str
    content_hash: str
    specs: list[TaskSpec]


@dataclass(frozen=True)
class EnvInfo:
    """What an environment is and offers (GetEnvInfo)."""

    name: str
    actions: list[str]
    capabilities: list[str]
    eval_sets: list[str]


@dataclass(frozen=True)
class EpisodeState:
    """An episode after CreateEpisodes or a Step: its observation (images and text), the reward of
    the last turn, whether it is over, and the env's info map."""

    episode_id: str
    text: str
    images: list[bytes]
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    state_key: str = ""  # "" where the env gives none
    truncated: bool = False  # done because the move budget ran out


@dataclass(frozen=True)
class SamplingParams:
    temperature: float
    top_p: float
    max_tokens: int
    stop_token_ids: list[int]
    seed: int
    allowed_sequences: tuple[tuple[int, ...], ...] = ()  # constrained actions (services/common/constrained.py)


@dataclass(frozen=True)
class Prompt:
    """One generation request: the conversation's compact token ids (one placeholder per image),
    its images (PNG bytes), the sampling parameters and the adapter to sample with (version 0 =
    the base model)."""

    token_ids: list[int]
    images: list[bytes]
    sampling: SamplingParams
    adapter_run_id: str
    adapter_version: int


@dataclass(frozen=True)
class Generation:
    """The engine's answer to one Prompt: the prompt as it expanded it, the generated tokens with
    their log-probs and text, the adapter version used, and how many prompt tokens came from its
    prefix cache."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    adapter_version: int
    num_cached_tokens: int = 0


@dataclass(frozen=True)
class ModelInfo:
    model: str
    max_model_len: int
    sleep_supported: bool
    max_adapter_runs: int = 0  # runs whose adapters the replica keeps at once (0: it does not say)


@dataclass(frozen=True)
class LearnerState:
    """Where the learner stands in a run: optimiser steps, GRPO steps, adapter version published."""

    run_id: str
    step: int
    train_steps: int
    adapter_version: int
    restored_from: str = ""


@dataclass(frozen=True)
class TrainResult:
    step: int
    metrics: dict[str, float]
    skipped: bool


@dataclass(frozen=True)
class PublishedAdapter:
    version: int
    path: str
    manifest_sha256: str
