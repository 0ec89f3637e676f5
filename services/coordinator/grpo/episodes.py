"""Playing a batch of episodes: all active episodes advance together, one batched Generate (split
across rollout replicas, each episode staying on one, issued concurrently) and one batched env
Step per turn.

The conversation of every episode is kept as token ids (services.common.conversation); the result
carries the engine-expanded record the learner trains on.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from services.common import tracing
from services.common.conversation import ChatTokens, TokenConversation, Tokenizer
from services.common.task import episode_solved
from services.coordinator.ops.replicas import Services
from services.coordinator.ops.wire import EpisodeState, Prompt, SamplingParams, TaskSpec


@dataclass
class Timers:
    """Wall-clock seconds spent waiting on each service."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, name: str, started: float) -> None:
        self.seconds[name] += time.perf_counter() - started


@dataclass
class EpisodeResult:
    spec: TaskSpec
    group_index: int
    conversation: TokenConversation
    actions: list[str] = field(default_factory=list)
    # With keep_frames: every observation's images in order, and how many each observation had.
    frames: list[bytes] = field(default_factory=list)
    frame_counts: list[int] = field(default_factory=list)
    # One reward per turn (the env's reward of that transition).
    rewards: list[float] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    # The env ended the episode because the task ended (terminated) or its move budget ran out
    # (truncated); neither while it runs or when the run's turn limit cut it.
    terminated: bool = False
    truncated: bool = False
    adapter_version: int = 0
    episode_id: str = ""
    # One digest per turn of the images the action was chosen from (equal: the observation did not
    # change), and the env's state key of that observation ("" where the env gives none).
    observation_keys: list[str] = field(default_factory=list)
    state_keys: list[str] = field(default_factory=list)
    # The digest of the observation the episode ended on ("" while it runs): where it got to.
    final_observation_key: str = ""
    # One flag per turn: the env could not read the action (its `info.invalid`, e.g. "downright").
    invalid_turns: list[bool] = field(default_factory=list)
    # Prompt tokens the engine saw over all turns, and how many of them its prefix cache held.
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0

    @property
    def reward(self) -> float:
        """The undiscounted sum of the turns' rewards."""
        return sum(self.rewards)

    @property
    def observations(self) -> list[str]:
        """The digests of every observation the episode saw, the one it ended on included."""
        return self.observation_keys + ([self.final_observation_key] if self.final_observation_key else [])

    @property
    def solved(self) -> bool:
        return episode_solved(self.info, self.reward)


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
    allowed: tuple[tuple[int, ...], ...] = ()
    """Constrained actions' mask (services/common/constrained.py); () = free text."""

    def greedy(self) -> Sampling:
        """Temperature 0 (what the eval measures), under the same constraint."""
        return Sampling(0.0, 1.0, self.max_tokens, self.allowed)


def observation_key(images: list[bytes]) -> str:
    """A digest of an observation's images (length-prefixed, so that splits cannot collide)."""
    digest = hashlib.blake2b(digest_size=16)
    for data in images:
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def _sampling_params(sampling: Sampling, seed: int, stop_ids: list[int]) -> SamplingParams:
    return SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p,
                          max_tokens=sampling.max_tokens, stop_token_ids=stop_ids, seed=seed,
                          allowed_sequences=sampling.allowed)


@dataclass(frozen=True)
class Prompting:
    """How conversations are written: the tokenizer, the chat template's tokens, the system turn and
    the history window (None: the whole conversation; k: the last k answered turns)."""

    tokenizer: Tokenizer
    chat: ChatTokens
    system_prompt: str
    history_window: int | None = None

    def open_conversation(self, state: EpisodeState) -> TokenConversation:
        """A new episode's conversation: the system turn (if any) and its first observation."""
        conv = TokenConversation(self.chat, window=self.history_window)
        if self.system_prompt:
            conv.add_system(self.tokenizer, self.system_prompt)
        conv.add_observation(self.tokenizer, state.text, state.images)
        return conv


@dataclass(frozen=True)
class Policy:
    """The policy that acts: the base model (version 0) or the run's adapter version."""

    run_id: str
    adapter_version: int


@dataclass(frozen=True)
class PlayPlan:
    """What to play: `samples_per_spec` episodes of every spec, at most `max_turns` turns each; the first
    `greedy_per_spec` of each spec at temperature 0, the rest with `sampling` (seeded from `seed`);
    with `keep_frames` every observation's images are kept."""

    specs: list[TaskSpec]
    samples_per_spec: int
    sampling: Sampling
    max_turns: int
    seed: int
    greedy_per_spec: int = 0
    keep_frames: bool = False


async def play_episodes(services: Services, prompting: Prompting, policy: Policy, plan: PlayPlan,
                        timers: Timers) -> list[EpisodeResult]:
    """Plays the plan's episodes to the end; results in spec order."""
    samples_per_spec, sampling, seed, keep_frames = plan.samples_per_spec, plan.sampling, plan.seed, plan.keep_frames
    run_id, adapter_version, tokenizer, chat = policy.run_id, policy.adapter_version, prompting.tokenizer, prompting.chat
    greedy_per_spec = plan.greedy_per_spec
    greedy = sampling.greedy()
    all_specs = [spec for spec in plan.specs for _ in range(samples_per_spec)]
    started = time.perf_counter()
    created = await services.env.create_episodes(all_specs)
    timers.add("env", started)
    results: list[EpisodeResult] = []
    for index, (spec, state) in enumerate(zip(all_specs, created, strict=True)):
        conv = prompting.open_conversation(state)
        results.append(EpisodeResult(spec=spec, group_index=index // samples_per_spec, conversation=conv,
                                     frames=list(conv.images) if keep_frames else [],
                                     frame_counts=[len(conv.images)] if keep_frames else [],
                                     adapter_version=adapter_version, episode_id=state.episode_id,
                                     observation_keys=[observation_key(conv.images)],
                                     state_keys=[state.state_key]))
    active = list(range(len(results)))
    try:
        for turn in range(plan.max_turns):
            if not active:
                break
            with tracing.span("turn", turn=turn, episodes=len(active)):
                prompts = [
                    Prompt(
                        token_ids=results[i].conversation.compact_ids,
                        images=list(results[i].conversation.images),
                        sampling=_sampling_params(greedy if i % samples_per_spec < greedy_per_spec else sampling,
                                                  seed * 1_000_003 + i * 1009 + turn, [chat.im_end]),
                        adapter_run_id=run_id if adapter_version else "",
                        adapter_version=adapter_version,
                    )
                    for i in active
                ]
                started = time.perf_counter()
                generated = await services.rollouts.generate(prompts, [results[i].episode_id for i in active])
                timers.add("rollout", started)
                actions = []
                for i, generation in zip(active, generated, strict=True):
                    assert generation.adapter_version == adapter_version, "rollout sampled with another adapter"
                    results[i].conversation.add_generation(
                        generation.prompt_token_ids, generation.token_ids, generation.logprobs)
                    results[i].actions.append(generation.text)
                    results[i].prompt_tokens += len(generation.prompt_token_ids)
                    results[i].cached_prompt_tokens += generation.num_cached_tokens
                    actions.append((results[i].episode_id, generation.text))
                started = time.perf_counter()
                stepped = await services.env.step(actions)
                timers.add("env", started)
                still_active = []
                for i, state in zip(active, stepped, strict=True):
                    episode = results[i]
                    episode.rewards.append(state.reward)
                    episode.info = state.info
                    episode.invalid_turns.append(bool(episode.info.get("invalid", False)))
                    if keep_frames:
                        episode.frames += state.images
                        episode.frame_counts.append(len(state.images))
                    if state.done:
                        episode.final_observation_key = observation_key(state.images)
                        episode.terminated, episode.truncated = not state.truncated, state.truncated
                        continue
                    episode.conversation.add_observation(tokenizer, state.text, state.images)
                    episode.observation_keys.append(observation_key(state.images))
                    episode.state_keys.append(state.state_key)
                    still_active.append(i)
                active = still_active
    finally:
        ids = [r.episode_id for r in results]
        services.rollouts.forget(ids)
        started = time.perf_counter()
        await services.env.close_episodes(ids)
        timers.add("env", started)
    return results
