"""The SFT's data: the tasks the expert plays and checks, and the expert's conversations.

Tasks. One GetTrainingTasks call (seed `mmrl-sft:<seed>`) draws `num_tasks` training tasks plus, with
checks, `check_tasks` validation tasks; the env service answers distinct tasks, none of an eval set, so
the validation tasks are tasks the SFT never trains on. The env must have the 'oracle' capability.

Conversations. Each is played against the env service (gRPC): the system turn, then per turn the frame
+ observation text and the expert action (`info["optimal_action"]`, the env's oracle). With
`perturb_prob` > 0 a turn may instead start a detour: 1..`detour_moves` random other moves that are
*not* trained on, so the expert's recovery from detours, dead ends and bumps is in the data. Only
solved episodes are kept; with `history_window` set, each trained turn of one is a conversation
of its own (the system turn, the last `history_window` turns and its observation). Conversations
are token ids built exactly as the coordinator builds them (services.common.conversation), with
image placeholders expanded to the processor's token count, so SFT and GRPO see identical prompts.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from mmrl.sft.config import SftConfig
from mmrl_proto.v1 import env_pb2, env_pb2_grpc
from services.common.conversation import ChatTokens, TokenConversation, expand_image_placeholders
from services.common.grpc_server import sync_channel
from services.common.task import episode_solved
from services.common.trajectory import Trajectory
from services.common.user_errors import UsageError
from services.learner.batch import ModelSpec, decode_image


@dataclass(frozen=True)
class SftTasks:
    """The tasks of one SFT: those the expert plays, and the validation tasks of the checks."""

    training: list[env_pb2.EpisodeSpec]
    validation: list[env_pb2.EpisodeSpec]


def draw_tasks(env_address: str, config: SftConfig) -> SftTasks:
    """The SFT's tasks from the env service (module docstring); ValueError when the env is not the one
    the config names or has no oracle, UsageError when it refuses the draw (e.g. more tasks than its
    `max_batch`)."""
    with sync_channel(env_address) as channel:
        stub = env_pb2_grpc.EnvServiceStub(channel)
        info = stub.GetEnvInfo(env_pb2.GetEnvInfoRequest(), timeout=60)
        if config.env and info.name != config.env:
            raise ValueError(f"the SFT config is for env {config.env!r}; the env service is {info.name!r}")
        if "oracle" not in info.capabilities:
            raise ValueError(f"env {info.name!r} has no 'oracle' capability (info.optimal_action): "
                             "no expert to imitate")
        try:
            reply = stub.GetTrainingTasks(env_pb2.GetTrainingTasksRequest(
                seed=f"mmrl-sft:{config.seed}", count=config.num_drawn(), max_moves=config.max_moves,
                options=config.options), timeout=600)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.INVALID_ARGUMENT:
                raise
            raise UsageError(f"the env service refused the SFT's task draw (num_tasks + check_tasks = "
                             f"{config.num_drawn()}, drawn in one request): {error.details()}; lower num_tasks "
                             "or check_tasks, or raise the env service's max_batch") from None
    specs = list(reply.specs)
    return SftTasks(training=specs[:config.num_tasks], validation=specs[config.num_tasks:])


def image_token_counter(processor: Any, spec: ModelSpec) -> Callable[[bytes], int]:
    """Image tokens of a frame; every frame of one maze size has the same shape, so the processor
    runs on the first frame only."""
    per_image: list[int] = []

    def tokens_per_image(frame: bytes) -> int:
        if not per_image:
            grid = processor.image_processor(images=[decode_image(frame)], return_tensors="pt")["image_grid_thw"]
            per_image.append(int(grid.prod().item()) // spec.merge_size**2)
        return per_image[0]

    return tokens_per_image


def expert_conversations(
    env_address: str, config: SftConfig, specs: Sequence[env_pb2.EpisodeSpec], tokenizer: Any,
    tokens_per_image: Callable[[bytes], int], batch: int = 256,
) -> list[Trajectory]:
    """Plays the expert on `specs` (the training tasks) and returns the solved episodes as
    trajectories (loss on the expert's action tokens)."""
    chat = ChatTokens.from_tokenizer(tokenizer)
    rng = random.Random(config.seed)
    trajectories: list[Trajectory] = []
    with sync_channel(env_address) as env_channel:
        stub = env_pb2_grpc.EnvServiceStub(env_channel)
        actions_of_env = tuple(stub.GetEnvInfo(env_pb2.GetEnvInfoRequest(), timeout=60).actions)
        all_specs = list(specs)
        moves = [a for a in actions_of_env if a != "stop"]  # detours move; a stop would end the episode
        for first in range(0, len(all_specs), batch):
            specs = all_specs[first:first + batch]
            created = stub.CreateEpisodes(env_pb2.CreateEpisodesRequest(specs=specs), timeout=120)
            convs = {}
            states = {}
            detour_left: dict[str, int] = {}  # random moves still to play, per episode
            returns: dict[str, float] = {}  # the sum of each episode's rewards so far
            for spec, state in zip(specs, created.episodes, strict=True):
                conv = TokenConversation(chat, window=config.history_window)
                conv.add_system(tokenizer, config.system_prompt)
                states[state.episode_id] = (spec, state)
                convs[state.episode_id] = conv
            while states:
                actions = []
                for episode_id, (_spec, state) in states.items():
                    info = MessageToDict(state.info)
                    expert = str(info["optimal_action"])
                    left = detour_left.get(episode_id, 0)
                    if left == 0 and expert != "stop" and rng.random() < config.perturb_prob:
                        # No length draw for one-move detours: the default keeps its earlier data.
                        left = rng.randint(1, config.detour_moves) if config.detour_moves > 1 else 1
                    detour = left > 0
                    detour_left[episode_id] = max(left - 1, 0)
                    action = rng.choice([a for a in moves if a != expert]) if detour else expert
                    conv = convs[episode_id]
                    frames = [img.data for img in state.observation.images]
                    conv.add_observation(tokenizer, state.observation.text, frames)
                    expanded = expand_image_placeholders(conv.compact_ids, chat.image_pad,
                                                         [tokens_per_image(f) for f in conv.images])
                    generated = [*tokenizer.encode(action, add_special_tokens=False), chat.im_end]
                    # A detour is played, not imitated: only the expert's moves are trained on.
                    conv.add_generation(expanded, generated, [0.0] * len(generated), trainable=not detour)
                    actions.append(env_pb2.EpisodeAction(episode_id=episode_id, action=action))
                stepped = stub.Step(env_pb2.StepRequest(actions=actions), timeout=120)
                for new_state in stepped.episodes:
                    spec, _ = states[new_state.episode_id]
                    returns[new_state.episode_id] = returns.get(new_state.episode_id, 0.0) + new_state.reward
                    if new_state.done:
                        del states[new_state.episode_id]
                        conv = convs[new_state.episode_id]
                        solved = episode_solved(MessageToDict(new_state.info), returns[new_state.episode_id])
                        if solved:  # a windowed episode: one conversation per trained turn
                            played = conv.to_trajectories(
                                f"sft-{spec.seed}", [[float(m) for m in seg.loss_mask] for seg in conv.segments()],
                                reward=new_state.reward)
                            trajectories += [t for t in played if t.num_generated_tokens > 0]
                    else:
                        states[new_state.episode_id] = (spec, new_state)
            stub.CloseEpisodes(env_pb2.CloseEpisodesRequest(episode_ids=list(convs)), timeout=60)
    return trajectories
