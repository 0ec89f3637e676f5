"""Multi-turn maze-like trajectories for the benchmark and the tests, built the way the
coordinator builds them (`services.common.conversation`): compact prompts with one placeholder
per frame go to a generator, whose expanded prompt ids, generated ids and log-probs are recorded.

`fake_generator` imitates the engine without a model (expansion with the processor's token
count, random action tokens and log-probs); `vllm_generator` wraps a real in-process vLLM engine.
Frames are the maze environment's own (services/env/maze: 9x9 grid, 8 px per unit, 80x80 px).
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable, Sequence
from typing import Any

from PIL import Image

from services.common.conversation import ChatTokens, TokenConversation
from services.common.trajectory import Trajectory
from services.env.kit.grid import DIRECTIONS, step_cell
from services.env.maze.maze import generate_maze, solve
from services.env.maze.render import MazeRenderer

# (compact prompt ids, frames) per episode -> (expanded prompt ids, generated ids, log-probs) each.
Generator = Callable[[list[tuple[list[int], list[bytes]]]], list[tuple[list[int], list[int], list[float]]]]

ACTIONS = tuple(DIRECTIONS)


def maze_frame(seed: int, agent_step: int = 0, size: int = 9, unit_px: int = 8) -> bytes:
    """PNG of the maze of `seed` as the env renders it, the agent `agent_step` moves along the way from
    the start to the goal (on the goal once the way is walked)."""
    maze = generate_maze(seed, size)
    cell = maze.start
    for direction in solve(maze)[:agent_step]:
        cell = step_cell(cell, direction)
    return MazeRenderer(maze, unit_px, cache=False).render(cell)


def fake_generator(chat: ChatTokens, tokenizer: Any, tokens_per_image: int, seed: int = 0) -> Generator:
    """An engine stand-in: expands each placeholder to `tokens_per_image` tokens and 'generates'
    an action word plus <|im_end|> with random log-probs."""
    from services.common.conversation import expand_image_placeholders

    rng = random.Random(seed)
    action_ids = {a: tokenizer.encode(a, add_special_tokens=False) for a in ACTIONS}

    def generate(
        prompts: list[tuple[list[int], list[bytes]]],
    ) -> list[tuple[list[int], list[int], list[float]]]:
        out = []
        for compact, frames in prompts:
            expanded = expand_image_placeholders(compact, chat.image_pad, [tokens_per_image] * len(frames))
            generated = [*action_ids[rng.choice(ACTIONS)], chat.im_end]
            out.append((expanded, generated, [-rng.uniform(0.05, 3.0) for _ in generated]))
        return out

    return generate


def vllm_generator(llm: Any, sampling_params: Any, lora_request: Any = None) -> Generator:
    """Generation with a real in-process `vllm.LLM` (token ids in, expanded ids and log-probs out)."""

    def generate(
        prompts: list[tuple[list[int], list[bytes]]],
    ) -> list[tuple[list[int], list[int], list[float]]]:
        requests = [
            {
                "prompt_token_ids": compact,
                "multi_modal_data": {"image": [Image.open(io.BytesIO(f)) for f in frames]},
            }
            for compact, frames in prompts
        ]
        outputs = llm.generate(requests, sampling_params, lora_request=lora_request, use_tqdm=False)
        results = []
        for output in outputs:
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [step[token].logprob for token, step in zip(ids, completion.logprobs, strict=True)]
            results.append((list(output.prompt_token_ids), ids, logprobs))
        return results

    return generate


def play_episodes(
    generate: Generator,
    tokenizer: Any,
    num_groups: int,
    group_size: int,
    num_turns: int,
    seed: int = 0,
    system_prompt: str = "You are a maze solving agent. Reply with one move: up, down, left or right.",
) -> list[Trajectory]:
    """`num_groups` x `group_size` episodes of `num_turns` turns (one frame per turn; every episode
    of a group sees the same maze), with a random 0/1 reward and the group-centred reward as the
    advantage of every generated token."""
    chat = ChatTokens.from_tokenizer(tokenizer)
    rng = random.Random(seed)
    conversations = [TokenConversation(chat) for _ in range(num_groups * group_size)]
    for conversation in conversations:
        conversation.add_system(tokenizer, system_prompt)
    for turn in range(num_turns):
        for index, conversation in enumerate(conversations):
            frame = maze_frame(seed * 10_000 + index // group_size, agent_step=turn)
            conversation.add_observation(tokenizer, f"Moves left: {num_turns - turn}.", [frame])
        replies = generate([(c.compact_ids, list(c.images)) for c in conversations])
        for conversation, (expanded, generated, logprobs) in zip(conversations, replies, strict=True):
            conversation.add_generation(expanded, generated, logprobs)
    rewards = [float(rng.random() < 0.5) for _ in conversations]
    trajectories = []
    for index, conversation in enumerate(conversations):
        group = index // group_size
        members = rewards[group * group_size : (group + 1) * group_size]
        advantage = rewards[index] - sum(members) / len(members)
        trajectories.append(conversation.to_trajectory(
            f"ep-{index:04d}", [advantage * m for m in conversation.loss_mask], reward=rewards[index],
            group_id=f"g{group}",
        ))
    return trajectories


def with_advantages(trajectories: Sequence[Trajectory], values: Sequence[float]) -> list[Trajectory]:
    """Copies with a constant advantage per trajectory on its generated tokens."""
    from dataclasses import replace

    return [
        replace(t, advantages=tuple(v * m for m in t.loss_mask))
        for t, v in zip(trajectories, values, strict=True)
    ]
