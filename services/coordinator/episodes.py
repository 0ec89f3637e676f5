"""Playing a batch of episodes: all active episodes advance together, one batched Generate (split
across rollout replicas, issued concurrently) and one batched env Step per turn.

The conversation of every episode is kept as token ids (services.common.conversation); the result
carries the engine-expanded record the learner trains on.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.json_format import MessageToDict

from mmrl.v1 import env_pb2, rollout_pb2
from services.common.conversation import ChatTokens, TokenConversation, Tokenizer
from services.coordinator.clients import RolloutClient, Services


@dataclass
class Timers:
    """Wall-clock seconds spent waiting on each service."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, name: str, started: float) -> None:
        self.seconds[name] += time.perf_counter() - started


@dataclass
class EpisodeResult:
    spec: env_pb2.EpisodeSpec
    group_index: int
    conversation: TokenConversation
    actions: list[str] = field(default_factory=list)
    frames: list[bytes] = field(default_factory=list)
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    adapter_version: int = 0
    episode_id: str = ""
    # One digest per turn of the images the action was chosen from: equal digests within a group
    # mark the same environment state (step-level advantages group turns by it).
    observation_keys: list[str] = field(default_factory=list)
    # The digest of the observation the episode ended on ("" while it runs): where it got to.
    final_observation_key: str = ""
    # One flag per turn: the env could not read the action (its `info.invalid`, e.g. "downright").
    invalid_turns: list[bool] = field(default_factory=list)
    # Prompt tokens the engine saw over all turns, and how many of them its prefix cache held.
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0

    @property
    def solved(self) -> bool:
        return bool(self.info.get("solved", self.reward > 0))


def prefix_cached_fraction(episodes: list[EpisodeResult]) -> float:
    """The share of the episodes' prompt tokens whose KV cache the engine reused from an earlier turn."""
    prompt = sum(e.prompt_tokens for e in episodes)
    return sum(e.cached_prompt_tokens for e in episodes) / prompt if prompt else 0.0


def invalid_fraction(episodes: list[EpisodeResult]) -> float:
    """The share of the episodes' turns whose action the env could not read."""
    flags = [f for e in episodes for f in e.invalid_turns]
    return sum(flags) / len(flags) if flags else 0.0


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    max_tokens: int

    @classmethod
    def greedy(cls, max_tokens: int) -> Sampling:
        """Temperature 0: the most likely token every time (what the eval measures)."""
        return cls(0.0, 1.0, max_tokens)


def observation_key(images: list[bytes]) -> str:
    """A digest of an observation's images (length-prefixed, so that splits cannot collide)."""
    digest = hashlib.blake2b(digest_size=16)
    for data in images:
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def _sampling_proto(sampling: Sampling, seed: int, stop_ids: list[int]) -> rollout_pb2.SamplingParams:
    """The request's sampling parameters; the seed is taken modulo 2**63 to fit the int64 field."""
    return rollout_pb2.SamplingParams(
        temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens,
        stop_token_ids=stop_ids, n=1, seed=seed % 2**63,
    )


async def _generate_split(
    rollouts: list[RolloutClient], requests: list[rollout_pb2.GenerationRequest]
) -> list[rollout_pb2.GenerationResult]:
    """One Generate per replica with a contiguous share of the batch, concurrently."""
    shares = len(rollouts)
    bounds = [len(requests) * i // shares for i in range(shares + 1)]
    calls = [
        client.call("Generate", client.stub.Generate,
                    rollout_pb2.GenerateRequest(requests=requests[bounds[i]:bounds[i + 1]]))
        for i, client in enumerate(rollouts) if bounds[i] < bounds[i + 1]
    ]
    replies = await asyncio.gather(*calls)
    return [result for reply in replies for result in reply.results]


def open_conversation(tokenizer: Tokenizer, chat: ChatTokens, system_prompt: str,
                      state: env_pb2.EpisodeState) -> TokenConversation:
    """A new episode's conversation: the system turn (if any) and its first observation."""
    conv = TokenConversation(chat)
    if system_prompt:
        conv.add_system(tokenizer, system_prompt)
    conv.add_observation(tokenizer, state.observation.text, [img.data for img in state.observation.images])
    return conv


async def play_episodes(
    services: Services,
    tokenizer: Tokenizer,
    chat: ChatTokens,
    specs: list[env_pb2.EpisodeSpec],
    *,
    samples_per_spec: int,
    sampling: Sampling,
    run_id: str,
    adapter_version: int,
    system_prompt: str,
    max_turns: int,
    seed: int,
    timers: Timers,
    keep_frames: bool = False,
    greedy_per_spec: int = 0,
) -> list[EpisodeResult]:
    """Plays `samples_per_spec` episodes of every spec to the end; results in spec order. The
    first `greedy_per_spec` episodes of each spec are played at temperature 0, the rest with
    `sampling`."""
    greedy = Sampling.greedy(sampling.max_tokens)
    all_specs = [spec for spec in specs for _ in range(samples_per_spec)]
    started = time.perf_counter()
    created = await services.env.call("CreateEpisodes", services.env.stub.CreateEpisodes,
                                      env_pb2.CreateEpisodesRequest(specs=all_specs))
    timers.add("env", started)
    results: list[EpisodeResult] = []
    for index, (spec, state) in enumerate(zip(all_specs, created.episodes, strict=True)):
        conv = open_conversation(tokenizer, chat, system_prompt, state)
        results.append(EpisodeResult(spec=spec, group_index=index // samples_per_spec, conversation=conv,
                                     frames=list(conv.images) if keep_frames else [],
                                     adapter_version=adapter_version, episode_id=state.episode_id,
                                     observation_keys=[observation_key(conv.images)]))
    active = list(range(len(results)))
    try:
        for turn in range(max_turns):
            if not active:
                break
            requests = [
                rollout_pb2.GenerationRequest(
                    prompt_token_ids=results[i].conversation.compact_ids,
                    images=[{"data": d, "mime_type": "image/png"} for d in results[i].conversation.images],
                    sampling=_sampling_proto(greedy if i % samples_per_spec < greedy_per_spec else sampling,
                                             seed * 1_000_003 + i * 1009 + turn, [chat.im_end]),
                    adapter_run_id=run_id if adapter_version else "",
                    adapter_version=adapter_version,
                )
                for i in active
            ]
            started = time.perf_counter()
            generated = await _generate_split(services.rollouts, requests)
            timers.add("rollout", started)
            actions = []
            for i, result in zip(active, generated, strict=True):
                completion = result.completions[0]
                assert result.adapter_version == adapter_version, "rollout sampled with another adapter"
                results[i].conversation.add_generation(
                    list(result.prompt_token_ids), list(completion.token_ids), list(completion.logprobs))
                results[i].actions.append(completion.text)
                results[i].prompt_tokens += len(result.prompt_token_ids)
                results[i].cached_prompt_tokens += result.num_cached_tokens
                actions.append(env_pb2.EpisodeAction(episode_id=results[i].episode_id, action=completion.text))
            started = time.perf_counter()
            stepped = await services.env.call("Step", services.env.stub.Step,
                                              env_pb2.StepRequest(actions=actions))
            timers.add("env", started)
            still_active = []
            for i, state in zip(active, stepped.episodes, strict=True):
                episode = results[i]
                episode.reward = state.reward
                episode.info = MessageToDict(state.info)
                episode.invalid_turns.append(bool(episode.info.get("invalid", False)))
                frames = [img.data for img in state.observation.images]
                if keep_frames:
                    episode.frames += frames
                if state.done:
                    episode.final_observation_key = observation_key(frames)
                    continue
                episode.conversation.add_observation(tokenizer, state.observation.text, frames)
                episode.observation_keys.append(observation_key(frames))
                still_active.append(i)
            active = still_active
    finally:
        started = time.perf_counter()
        await services.env.call("CloseEpisodes", services.env.stub.CloseEpisodes,
                                env_pb2.CloseEpisodesRequest(episode_ids=[r.episode_id for r in results]))
        timers.add("env", started)
    return results
