"""Hindsight relabelling (HER, Andrychowicz et al. 2017) of failed maze episodes, and the same
replay of solved episodes that took detours (self-imitation of their clean way).

A failed episode still found a way somewhere: to the cell where it ended. Relabelled with that
cell as the goal, its loop-erased path (advantages.loop_erased_turns: wall bumps and detours that
came back removed) is a solved episode; in a perfect maze it is the shortest way there. The
relabelled episode is played again on the env service with `options.goal` set to that cell, so its
frames (the goal drawn where the episode ended), texts and reward are the environment's own; its
actions are the episode's own generated tokens. No oracle is asked anything.

A solved episode with bumps or detours is replayed the same way along its loop-erased path, to its
own goal: the history the policy would have seen had it gone straight there (`grpo.hindsight_episodes`
chooses which episodes are replayed: failed, solved or both).

The learner trains on a relabelled episode like on any other, with the fixed advantage
`grpo.hindsight_advantage` on every action token. The policy never sampled these actions in these
contexts, so there is no rollout log-prob: it is recorded as 0 (probability 1). Under
`old_logprobs: rollout` the PPO ratio is then the policy's current probability of the move
(at most 1, so the upper clip never binds) and the surrogate is advantage x probability; under
`old_logprobs: learner` the learner's own log-probs are the old policy, as for every episode.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from services.common.conversation import ChatTokens, TokenConversation, Tokenizer, expand_image_placeholders
from services.common.trajectory import Trajectory
from services.coordinator.advantages import loop_erased_turns
from services.coordinator.clients import Services
from services.coordinator.config import Replayed
from services.coordinator.episodes import EpisodeResult, Timers, open_conversation
from services.coordinator.wire import TaskSpec

# The outcomes (solved or not) of the episodes each `grpo.hindsight_episodes` value replays.
_OUTCOMES: dict[str, tuple[bool, ...]] = {"failed": (False,), "solved": (True,), "both": (False, True)}


@dataclass(frozen=True)
class Relabel:
    """An episode's way to where it ended: the env options of the replay (a failed episode's make
    that cell the goal), and the turns of its loop-erased path."""

    episode: EpisodeResult
    options: dict[str, str]
    turns: tuple[int, ...]

    @property
    def key(self) -> tuple[int, tuple[tuple[str, str], ...], tuple[str, ...]]:
        """Equal for two episodes of a maze that took the same way to the same cell."""
        actions = tuple(self.episode.actions[t] for t in self.turns)
        return self.episode.spec.seed, tuple(sorted(self.options.items())), actions


def relabel(episode: EpisodeResult) -> Relabel | None:
    """The replay of an episode along its loop-erased path: a failed one to the cell where it ended,
    made the goal; a solved one to its own goal. None when there is nothing new to learn: a solved
    episode without bumps or detours (its replay is itself), a failed one back where it started."""
    n = len(episode.actions)
    # Where it ended: the observation it ended on, or the next one of an episode cut at the turn limit.
    final = episode.final_observation_key or (episode.observation_keys[n:] or [""])[0]
    if not final or not (episode.solved or "position" in episode.info):
        return None
    keys = [*episode.observation_keys[:n], final]
    on_path = loop_erased_turns(keys, n + 1)[:n]  # the last "turn" is the end: a return to it is a loop
    turns = tuple(t for t in range(n) if on_path[t])
    if episode.solved:
        return Relabel(episode=episode, options=dict(episode.spec.options), turns=turns) if len(turns) < n else None
    if not turns:
        return None
    row, col = (int(v) for v in episode.info["position"])
    options = {**dict(episode.spec.options), "goal": f"{row},{col}"}
    return Relabel(episode=episode, options=options, turns=turns)


def select(episodes: Sequence[Sequence[EpisodeResult]], limit: int, replayed: Replayed = "failed") -> list[Relabel]:
    """Up to `limit` distinct relabellings of the `replayed` episodes, taken round-robin over the
    groups (the first such episode of every group, then the second, ...) so that they spread over
    the mazes."""
    outcomes = _OUTCOMES.get(replayed)
    if outcomes is None:
        raise ValueError(f"replayed episodes must be 'failed', 'solved' or 'both', got {replayed!r}")
    chosen: dict[tuple[object, ...], Relabel] = {}
    for index in range(max((len(g) for g in episodes), default=0)):
        for group in episodes:
            if len(chosen) >= limit:
                return list(chosen.values())
            take = index < len(group) and group[index].solved in outcomes
            found = relabel(group[index]) if take else None
            if found is not None and found.key not in chosen:
                chosen[found.key] = found
    return list(chosen.values())


def _generated_ids(conv: TokenConversation, turn: int) -> list[int]:
    """The tokens the engine generated at `turn` (loss mask 1 between its start and the next)."""
    end = conv.turn_starts[turn + 1] if turn + 1 < conv.num_turns else len(conv.record_ids)
    start = conv.turn_starts[turn]
    return [t for t, m in zip(conv.record_ids[start:end], conv.loss_mask[start:end], strict=True) if m]


def _tokens_per_image(conv: TokenConversation, chat: ChatTokens) -> int:
    """The engine's expansion of one image placeholder (frames of a run share one size)."""
    return sum(1 for t in conv.record_ids if t == chat.image_pad) // max(conv.num_recorded_images, 1)


async def replay(
    services: Services, tokenizer: Tokenizer, chat: ChatTokens, relabels: Sequence[Relabel], *,
    system_prompt: str, timers: Timers,
) -> list[TokenConversation]:
    """Plays every relabelling on the env service, all at once, turn by turn; returns the solved
    conversations (a replay that does not reach its goal on its last move is left out)."""
    if not relabels:
        return []
    started = time.perf_counter()
    specs = [TaskSpec(seed=r.episode.spec.seed, max_moves=r.episode.spec.max_moves, options=r.options)
             for r in relabels]
    created = await services.env.create_episodes(specs)
    ids = [state.episode_id for state in created]
    convs = [open_conversation(tokenizer, chat, system_prompt, state) for state in created]
    per_image = [_tokens_per_image(r.episode.conversation, chat) for r in relabels]
    solved = [False] * len(relabels)
    try:
        for k in range(max(len(r.turns) for r in relabels)):
            playing = [i for i, r in enumerate(relabels) if k < len(r.turns)]
            actions = []
            for i in playing:
                r, conv = relabels[i], convs[i]
                expanded = expand_image_placeholders(conv.compact_ids, chat.image_pad,
                                                     [per_image[i]] * len(conv.images))
                generated = _generated_ids(r.episode.conversation, r.turns[k])
                conv.add_generation(expanded, generated, [0.0] * len(generated))
                actions.append((ids[i], r.episode.actions[r.turns[k]]))
            stepped = await services.env.step(actions)
            for i, state in zip(playing, stepped, strict=True):
                last = k == len(relabels[i].turns) - 1
                solved[i] = last and state.done and bool(state.info.get("solved", state.reward > 0))
                if not state.done:
                    convs[i].add_observation(tokenizer, state.text, state.images)
    finally:
        await services.env.close_episodes(ids)
        timers.add("hindsight", started)
    return [conv for conv, ok in zip(convs, solved, strict=True) if ok]


def to_trajectories(convs: Sequence[TokenConversation], advantage: float, step: int,
                    adapter_version: int) -> list[Trajectory]:
    """Relabelled episodes as learner trajectories: `advantage` on every action token, rollout
    log-probs 0 (see the module docstring)."""
    return [
        conv.to_trajectory(f"s{step}-h{k}", [advantage * m for m in conv.loss_mask], reward=1.0,
                           adapter_version=adapter_version, group_id=f"s{step}-hindsight")
        for k, conv in enumerate(convs)
    ]
