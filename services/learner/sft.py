"""Supervised warm start: expert multi-turn maze conversations from the environment's BFS oracle,
trained on the action tokens only, with the learner's batch and log-prob code.

Environments. The maze (`env: maze`, the default) plays the training seeds the config names; any
other environment with an oracle (e.g. `env: sokoban`) plays `num_mazes` training tasks its env
service draws (GetTrainingTasks, never an eval-set task) with the config's `options`. Frame reading
and checks (`stop_above`) are maze-only.

Data. Each conversation is played against the env service (gRPC): the system turn, then per turn
the frame + observation text and the expert action (`info["optimal_action"]`, the BFS oracle's
next move). With `perturb_prob` > 0 a turn may instead start a detour: 1..`detour_moves` random
non-optimal moves that are *not* trained on, so the expert's recovery from detours, dead ends and
wall bumps ("You hit a wall.") is in the data. Conversations are token ids built exactly as the
coordinator builds them (services.common.conversation), with image placeholders expanded to the
processor's token count, so SFT and GRPO see identical prompts.

Frame reading (optional, `reading_updates` > 0). A pretrained vision-language model can already say
what a picture shows; a random-initialised one cannot. So before the expert's conversations the model
can be taught to read single frames: one user turn with a frame of a training maze (agent on a random
cell) and the question READING_QUESTION, answered with the moves the walls leave open from the
agent's cell ("down right"). The answer names no way to the goal: it is what the frame shows, not
the oracle's next move, so the policy still has to be learnt from the expert's conversations and
then GRPO.

Training is a full fine-tune (every weight of the model, vision tower included) or a LoRA adapter
merged into the saved model (`finetune`), with the token-mean negative log-likelihood of the action
tokens (<|im_end|> included), AdamW and linear warm-up, on the learner's code path: one rank or
several (`mmrl sft --nproc N`, FSDP2), float32 on CPU or bfloat16 on GPU (services/learner/sft_ranks.py).
The result is a standard HF model directory that `mmrl serve rollout --model` and the learner load.

A start of a chosen strength (optional, `stop_above`). Where the SFT stops on purpose (a partially
trained start for GRPO), a fixed number of updates does not give the same start on every machine:
floating-point sums differ between CPUs, the runs drift apart, and near the steep part of the
learning curve the same budget gave 0.48 on one machine's fixed eval set and 0.62 on another's. With
`stop_above`, every `check_every` updates from `check_from` on the caller's `check` measures the
greedy solve rate of a saved checkpoint on `check_mazes` validation mazes (training seeds whose
layouts the SFT does not play and no eval set holds; `check_seeds`). Which checkpoint is saved is
`keep`:
- `before_first_above`: the first check above `stop_above` ends the SFT, and the last checkpoint at
  or below it is the one saved; `updates` is then the most the SFT may run.
- `last_at_or_below`: the SFT runs all `updates` (the last one is a check) and saves the checkpoint
  of the last check at or below `stop_above`: the most imitation that still leaves a start of the
  chosen strength. The solve rate does not rise steadily past the steep part of the curve (checks
  went 0.44 0.66 0.44 0.50 0.61 0.53 0.65 0.80 over 500..1,200 updates on one machine), and GRPO
  lifted a later checkpoint of the same strength much further
  (docs/experiments/2026-12-04-grpo-from-500-update-start-frame-cache.md).
In both, when no check is at or below `stop_above`, the first check's checkpoint is saved.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from google.protobuf.json_format import MessageToDict
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mmrl_proto.v1 import env_pb2, env_pb2_grpc
from services.common.conversation import (
    DEFAULT_SYSTEM_PROMPT,
    ChatTokens,
    TokenConversation,
    expand_image_placeholders,
)
from services.common.grpc_server import sync_channel
from services.common.maze import (  # the eval sets' seeds and layouts are never trained on
    DIRECTIONS,
    TRAIN_SEED_LIMIT,
    check_size,
    generate_maze,
    layout_key,
    num_cells_per_side,
    training_layout_seeds,
    training_seeds,
)
from services.common.training import LoraSettings
from services.common.trajectory import Trajectory
from services.learner import sft_ranks
from services.learner.batch import ModelSpec, collate, decode_image, prepare_batch
from services.learner.distributed import (
    DistContext,
    all_reduce,
    broadcast_object,
    init_distributed,
    is_sharded,
)
from services.learner.policy import load_processor, token_logprobs, trainable_parameters
from services.learner.trainer import micro_batches

log = logging.getLogger("mmrl.learner.sft")
ACTIONS = ("up", "down", "left", "right")
# Part of the fingerprint: bumped when the same config builds other data. 2: the training mazes skip
# the layouts reserved for eval sets (1 took seeds first_seed.. whatever their layouts).
SFT_DATA_VERSION = 2
_ADDED_LATER = ("detour_moves", "reading_updates", "reading_batch_size", "stop_above", "check_from", "check_every",
                "check_mazes", "check_first_seed", "keep", "env", "options", "finetune", "lora", "dtype", "device")
READING_QUESTION = "Which moves are open from your cell?"


class SftConfig(BaseModel):
    """`mmrl sft --config FILE` settings."""

    model_config = ConfigDict(extra="forbid")

    base_model: str = Field(..., description="HF model directory to fine-tune.")
    out: str = Field(..., description="Output model directory (standard HF layout).")
    env: str = Field(
        "maze", min_length=1, max_length=100,
        description="The environment the expert plays (the env service's GetEnvInfo name). 'maze': the maze "
                    "settings below (size, first_seed, frame reading, checks); any other: num_mazes training "
                    "tasks the env service draws (GetTrainingTasks, with `options`), no frame reading or checks.")
    options: dict[str, str] = Field(
        default_factory=dict, description="Environment settings of every task of an env other than the maze "
                                          "(must match the GRPO run's env.options).")
    size: int = Field(9, ge=5, le=51, description="Maze grid side (odd).")
    max_moves: int = Field(20, ge=1, description="Move budget of each expert episode.")
    num_mazes: int = Field(
        2000, ge=1, description="Training mazes: the first num_mazes training seeds from first_seed (eval layouts skipped).")
    first_seed: int = Field(500_000, ge=0, lt=1_000_000, description="First training seed (< 1e6: never eval).")
    perturb_prob: float = Field(0.0, ge=0.0, lt=1.0, description="Chance of an untrained random move per turn.")
    detour_moves: int = Field(
        1, ge=1, le=20, description="A detour lasts 1..detour_moves random moves (longer ones lead into dead ends)."
    )
    reading_updates: int = Field(
        0, ge=0, description="Frame-reading updates before the expert's (open moves of one frame; 0: none).")
    reading_batch_size: int = Field(64, ge=1, description="Frame-reading questions per update.")
    updates: int = Field(300, ge=0, description="Optimiser updates on expert conversations (the SFT budget).")
    batch_size: int = Field(16, ge=1, description="Conversations per update.")
    micro_batch_size: int = Field(16, ge=1, description="Conversations per forward/backward.")
    learning_rate: float = Field(1e-3, gt=0.0, description="Peak AdamW learning rate.")
    warmup_steps: int = Field(20, ge=0, description="Linear warm-up updates.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0.0, description="Gradient clipping norm.")
    system_prompt: str = Field(DEFAULT_SYSTEM_PROMPT, description="System turn (must match the GRPO runs).")
    seed: int = Field(0, description="Seed of data perturbation, shuffling and dropout.")
    finetune: Literal["full", "lora"] = Field(
        "full", description="full: every weight trains. lora: a LoRA adapter (`lora`) on the frozen base, merged "
                            "into the saved model; sharded, no rank holds the whole base (the way to warm-start an "
                            "8B model). services/learner/sft_ranks.py.")
    lora: LoraSettings = Field(default_factory=LoraSettings, description="LoRA settings with finetune: lora.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Compute dtype: auto is bfloat16 on GPU, float32 on CPU. Below float32 the model is "
                            "sharded with FSDP2 mixed precision (trained weights and AdamW state stay float32).")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where the ranks train (auto: CUDA when "
                                                                       "present).")
    save_at: list[int] = Field(
        default_factory=list, description="Also save intermediate checkpoints at these updates (<out>-u<N>)."
    )
    stop_above: float | None = Field(
        None, ge=0.0, lt=1.0,
        description="The top of the start's strength: the validation greedy solve rate that `keep` compares checks "
                    "with (None: no checks; train `updates`).")
    keep: Literal["before_first_above", "last_at_or_below"] = Field(
        "before_first_above",
        description="With stop_above, the checkpoint saved: the last one before the first check above it (which "
                    "ends the SFT), or the last checked one at or below it after all `updates`.")
    check_from: int = Field(500, ge=1, description="First update with a check (with stop_above).")
    check_every: int = Field(100, ge=1, description="Updates between checks (with stop_above).")
    check_mazes: int = Field(128, ge=1, description="Validation mazes per check (with stop_above).")
    check_first_seed: int = Field(
        900_000, ge=0, lt=TRAIN_SEED_LIMIT, description="Validation mazes: training seeds from here on (check_seeds).")

    @field_validator("size")
    @classmethod
    def _maze_size(cls, size: int) -> int:
        check_size(size)
        return size

    @model_validator(mode="after")
    def _training_seeds_only(self) -> SftConfig:
        if self.env != "maze":
            if self.reading_updates or self.stop_above is not None:
                raise ValueError(f"env {self.env!r}: reading_updates and stop_above are for the maze only")
            return self  # the env service draws training tasks, never an eval-set task
        if self.options:
            raise ValueError("options: the maze's settings are size and max_moves, not options")
        # The mazes skip the layouts reserved for eval sets (about 1 in 8), so they need more seeds
        # than num_mazes: check the seeds the SFT will play.
        try:
            training_seeds(self.first_seed, self.num_mazes, self.size)
        except ValueError as error:
            raise ValueError(f"{error}; SFT trains on training seeds only") from None
        if self.stop_above is not None and self.check_from > self.updates:
            raise ValueError(f"check_from {self.check_from} is after the last update ({self.updates}): no check "
                             "would run")
        if self.stop_above is not None and self.keep == "last_at_or_below" and not self.is_check(self.updates):
            raise ValueError(f"keep last_at_or_below needs a check after the last update: {self.updates} is not "
                             f"check_from {self.check_from} plus a multiple of check_every {self.check_every}")
        return self

    def is_check(self, update: int) -> bool:
        """Whether a check runs after `update` (only with stop_above)."""
        return (self.stop_above is not None and update >= self.check_from
                and (update - self.check_from) % self.check_every == 0)

    def fingerprint(self) -> str:
        """Identifies the checkpoint this config produces (used to reuse a cached SFT)."""
        import hashlib

        # Fields added later count only when set, so earlier checkpoints keep their fingerprint.
        model_fields = type(self).model_fields
        added_later = {name for name in _ADDED_LATER
                       if getattr(self, name) == model_fields[name].get_default(call_default_factory=True)}
        fields = self.model_dump_json(exclude={"out", "save_at", *added_later})
        return hashlib.sha256(f"{SFT_DATA_VERSION}:{fields}".encode()).hexdigest()[:16]

    def maze_seeds(self) -> list[int]:
        """The training mazes' seeds: from first_seed on, skipping layouts reserved for eval sets."""
        return list(training_seeds(self.first_seed, self.num_mazes, self.size))


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


def check_seeds(config: SftConfig) -> list[int]:
    """The validation mazes of the checks: `check_mazes` training seeds from `check_first_seed` on whose
    layouts are distinct, not reserved for eval sets, and not among the layouts the SFT trains on."""
    trained = frozenset(layout_key(seed, config.size) for seed in config.maze_seeds())
    return training_layout_seeds(config.check_first_seed, config.check_mazes, config.size, exclude=trained)


def expert_specs(stub: env_pb2_grpc.EnvServiceStub, config: SftConfig) -> list[env_pb2.EpisodeSpec]:
    """The tasks the expert plays: the maze's training seeds (`maze_seeds`), or for another env
    `num_mazes` training tasks it draws from the SFT's seed (never one of its eval sets)."""
    if config.env == "maze":
        return [env_pb2.EpisodeSpec(seed=s, max_moves=config.max_moves, options={"size": str(config.size)})
                for s in config.maze_seeds()]
    info = stub.GetEnvInfo(env_pb2.GetEnvInfoRequest(), timeout=60)
    if info.name != config.env:
        raise ValueError(f"the SFT config is for env {config.env!r}; the env service is {info.name!r}")
    if "oracle" not in info.capabilities:
        raise ValueError(f"env {info.name!r} has no 'oracle' capability (info.optimal_action): no expert to imitate")
    reply = stub.GetTrainingTasks(env_pb2.GetTrainingTasksRequest(
        seed=f"mmrl-sft:{config.seed}", count=config.num_mazes, max_moves=config.max_moves,
        options=config.options), timeout=300)
    return list(reply.specs)


def expert_conversations(
    env_address: str, config: SftConfig, tokenizer: Any, tokens_per_image: Callable[[bytes], int],
    batch: int = 256,
) -> list[Trajectory]:
    """Plays expert episodes on the env service and returns them as trajectories (loss on actions)."""
    chat = ChatTokens.from_tokenizer(tokenizer)
    rng = random.Random(config.seed)
    trajectories: list[Trajectory] = []
    with sync_channel(env_address) as env_channel:
        stub = env_pb2_grpc.EnvServiceStub(env_channel)
        all_specs = expert_specs(stub, config)
        for first in range(0, len(all_specs), batch):
            specs = all_specs[first:first + batch]
            created = stub.CreateEpisodes(env_pb2.CreateEpisodesRequest(specs=specs), timeout=120)
            convs = {}
            states = {}
            detour_left: dict[str, int] = {}  # random moves still to play, per episode
            for spec, state in zip(specs, created.episodes, strict=True):
                conv = TokenConversation(chat)
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
                    action = rng.choice([a for a in ACTIONS if a != expert]) if detour else expert
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
                    if new_state.done:
                        del states[new_state.episode_id]
                        conv = convs[new_state.episode_id]
                        if new_state.reward > 0 and sum(conv.loss_mask) > 0:
                            trajectories.append(conv.to_trajectory(
                                f"sft-{spec.seed}", [float(m) for m in conv.loss_mask], reward=new_state.reward))
                    else:
                        states[new_state.episode_id] = (spec, new_state)
            stub.CloseEpisodes(env_pb2.CloseEpisodesRequest(episode_ids=list(convs)), timeout=60)
    return trajectories


def open_moves(seed: int, size: int, cell: tuple[int, int]) -> list[str]:
    """The moves the walls leave open from `cell` in the maze of `seed` (in DIRECTIONS order)."""
    maze = generate_maze(seed, size)
    return [direction for direction in DIRECTIONS if maze.can_move(cell, direction)]


def frame_reading_questions(
    stub: env_pb2_grpc.EnvServiceStub, config: SftConfig, tokenizer: Any,
    tokens_per_image: Callable[[bytes], int], rng: random.Random, count: int,
) -> list[Trajectory]:
    """`count` single-turn questions: a frame of a training maze from the env service, with the agent
    on a random cell other than the goal, and the open moves from there as the answer to train on."""
    chat = ChatTokens.from_tokenizer(tokenizer)
    n = num_cells_per_side(config.size)
    picks = []
    maze_seeds = config.maze_seeds()
    for _ in range(count):
        seed = maze_seeds[rng.randrange(len(maze_seeds))]
        cell = divmod(rng.randrange(n * n - 1), n)  # the goal, the last cell, is never drawn
        picks.append((seed, cell))
    specs = [env_pb2.EpisodeSpec(seed=seed, max_moves=config.max_moves,
                                 options={"size": str(config.size), "start": f"{cell[0]},{cell[1]}"})
             for seed, cell in picks]
    created = stub.CreateEpisodes(env_pb2.CreateEpisodesRequest(specs=specs), timeout=120)
    stub.CloseEpisodes(env_pb2.CloseEpisodesRequest(episode_ids=[e.episode_id for e in created.episodes]),
                       timeout=60)
    questions = []
    for (seed, cell), state in zip(picks, created.episodes, strict=True):
        conv = TokenConversation(chat)
        conv.add_system(tokenizer, config.system_prompt)
        conv.add_observation(tokenizer, READING_QUESTION, [img.data for img in state.observation.images])
        expanded = expand_image_placeholders(conv.compact_ids, chat.image_pad,
                                             [tokens_per_image(f) for f in conv.images])
        answer = [*tokenizer.encode(" ".join(open_moves(seed, config.size, cell)), add_special_tokens=False),
                  chat.im_end]
        conv.add_generation(expanded, answer, [0.0] * len(answer))
        questions.append(conv.to_trajectory(f"reading-{seed}-{cell[0]}-{cell[1]}",
                                            [float(m) for m in conv.loss_mask], reward=1.0))
    return questions


def train_sft(config: SftConfig, env_address: str, progress: Callable[[str], None] = print,
              check: Callable[[Path], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Builds the data, fine-tunes, saves the model directory; returns a report (rank 0; {} on the
    others, which run it too under `mmrl sft --nproc N`). With `stop_above`, rank 0's
    `check(model_dir)` evaluates a checkpoint on the validation mazes (`check_seeds`) and returns the
    eval summary (`greedy_solve_rate`, `episodes`)."""
    from transformers import AutoConfig

    started = time.perf_counter()
    ctx = init_distributed(config.device)
    if config.stop_above is not None and check is None and ctx.is_main:
        raise ValueError("stop_above needs a check: the validation solve rate of a checkpoint")
    if not ctx.is_main:
        progress = _silent
    torch.manual_seed(config.seed)
    processor = load_processor(Path(config.base_model))
    model = sft_ranks.build_model(config, ctx)
    spec = ModelSpec.from_config(AutoConfig.from_pretrained(config.base_model))

    tokens_per_image = image_token_counter(processor, spec)
    data = expert_conversations(env_address, config, processor.tokenizer, tokens_per_image)
    num_actions = sum(t.num_generated_tokens for t in data)
    progress(f"sft data: {len(data)} expert conversations, {num_actions} action tokens "
             f"({time.perf_counter() - started:.1f} s)")

    fit = _Fitter(model, spec, processor, config, ctx, progress, started)
    reading_history: list[dict[str, Any]] = []
    if config.reading_updates:
        reading_rng = random.Random(config.seed + 1)  # its own draws: the expert data's order stays as it was
        with sync_channel(env_address) as channel:
            stub = env_pb2_grpc.EnvServiceStub(channel)
            reading_history = fit.run(
                "frame reading", config.reading_updates,
                lambda: frame_reading_questions(stub, config, processor.tokenizer, tokens_per_image, reading_rng,
                                                config.reading_batch_size),
                # Questions of one frame are short: a whole batch in one forward.
                micro_batch_size=config.reading_batch_size)

    rng = random.Random(config.seed)
    order: list[int] = []

    def next_batch() -> list[Trajectory]:
        if len(order) < config.batch_size:
            order.extend(rng.sample(range(len(data)), len(data)))
        picked = [data[i] for i in order[: config.batch_size]]
        del order[: config.batch_size]
        return picked

    checks: list[dict[str, Any]] = []

    def after_update(update: int, history: list[dict[str, Any]]) -> bool:
        """Intermediate saves and checks; True ends the SFT (a check above stop_above)."""
        is_check = config.is_check(update)
        if not (is_check or update in config.save_at):
            return False
        # The last update's model goes to `out` itself; earlier ones to <out>-u<N>.
        saved = Path(config.out) if update == config.updates else Path(f"{config.out}-u{update}")
        sft_ranks.save_model(model, processor, config, ctx, saved, {"updates": update, "loss_history": history},
                             _swap_in)
        if not is_check or check is None:
            return False
        if not ctx.is_main:  # rank 0 checks; the others learn its decision
            return bool(broadcast_object(None, ctx))
        summary = check(saved)
        rate = float(summary["greedy_solve_rate"])
        checks.append({"updates": update, "validation_solve_rate": rate, "episodes": summary["episodes"]})
        progress(f"sft check at update {update}: greedy solve rate {rate:.4f} on {config.check_mazes} "
                 f"validation mazes ({time.perf_counter() - started:.0f} s)")
        if config.keep == "last_at_or_below":
            _remove_unkept(config, checks, keep=_kept_update(config, checks, ran=update))
            return bool(broadcast_object(False, ctx))
        return bool(broadcast_object(config.stop_above is not None and rate > config.stop_above, ctx))

    history = fit.run("sft", config.updates, next_batch, config.micro_batch_size, after_update=after_update)
    kept = _kept_update(config, checks, ran=len(history))
    report = {
        "config": config.model_dump(), "fingerprint": config.fingerprint(), "num_conversations": len(data),
        "num_action_tokens": num_actions, "updates": kept, "updates_run": len(history),
        "final_loss": history[kept - 1]["loss"] if kept else None, "loss_history": history[:kept],
        "sft_wall_s": time.perf_counter() - started,
        "kind": "full-fine-tune" if config.finetune == "full" else "lora-merged", "ranks": ctx.world_size,
        "dtype": str(sft_ranks.compute_dtype(config, ctx)).removeprefix("torch."),
    }
    if checks:
        report["checks"] = checks
        report["stop_above"] = config.stop_above
        report["keep"] = config.keep
    if config.reading_updates:
        report["reading_updates"] = config.reading_updates
        report["reading_final_loss"] = reading_history[-1]["loss"]
        report["reading_loss_history"] = reading_history
    if kept == len(history):
        sft_ranks.save_model(model, processor, config, ctx, Path(config.out), report, _swap_in)
    if not ctx.is_main:
        return {}
    if kept != len(history):
        progress(f"sft keeps the checkpoint of update {kept} (keep {config.keep}, stop_above {config.stop_above})")
        _keep_checkpoint(Path(f"{config.out}-u{kept}"), Path(config.out), report, move=kept not in config.save_at)
    _remove_unkept(config, checks, keep=kept)  # the one kept was moved to `out`
    log.info("sft saved", extra={"out": config.out, "updates": kept, "wall_s": report["sft_wall_s"]})
    return report


def _kept_update(config: SftConfig, checks: list[dict[str, Any]], ran: int) -> int:
    """The update whose model the SFT keeps, after `ran` updates: the last one trained, unless checks
    rule otherwise (`keep`); then the last check at or below stop_above (the first check when none was)."""
    if not checks or config.stop_above is None:
        return ran
    if config.keep == "before_first_above" and checks[-1]["validation_solve_rate"] <= config.stop_above:
        return ran  # no check rose above it: the SFT ran all its updates
    below = [entry["updates"] for entry in checks if entry["validation_solve_rate"] <= config.stop_above]
    return below[-1] if below else checks[0]["updates"]


def _remove_unkept(config: SftConfig, checks: list[dict[str, Any]], keep: int) -> None:
    """Deletes the checkpoints saved only for a check, but for `keep`'s: the last update's model is `out`
    itself, and `save_at` asked for its own. During a `last_at_or_below` SFT this leaves at most one
    checkpoint beside `out`, the one the SFT would keep if it ended there."""
    for entry in checks:
        update = entry["updates"]
        if update not in (keep, config.updates) and update not in config.save_at:
            shutil.rmtree(f"{config.out}-u{update}", ignore_errors=True)


class _Fitter:
    """Full fine-tune updates with the token-mean NLL of the trained tokens; a fresh AdamW and warm-up
    per phase (frame reading, then the expert's conversations)."""

    def __init__(self, model: Any, spec: ModelSpec, processor: Any, config: SftConfig, ctx: DistContext,
                 progress: Callable[[str], None], started: float) -> None:
        self.model, self.spec, self.processor, self.config, self.ctx = model, spec, processor, config, ctx
        self.progress, self.started = progress, started
        self.sharded = is_sharded(ctx, sft_ranks.compute_dtype(config, ctx))

    def run(self, phase: str, updates: int, next_batch: Callable[[], list[Trajectory]], micro_batch_size: int,
            after_update: Callable[[int, list[dict[str, Any]]], bool] | None = None) -> list[dict[str, Any]]:
        """`updates` optimiser updates; `after_update(update, history)` returning True ends the phase early."""
        config, model, ctx = self.config, self.model, self.ctx
        params = [p for _, p in trainable_parameters(model)]
        optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / config.warmup_steps) if config.warmup_steps else 1.0)
        history: list[dict[str, Any]] = []
        for update in range(1, updates + 1):
            # Prepared per update (not all up front): pixel values of every frame would not fit memory.
            # Every rank draws the same batch and trains on its share: the loss is normalised by the whole
            # batch's token count and scaled by the world size, as FSDP2 averages the ranks' gradients.
            picked = prepare_batch(next_batch(), self.spec, self.processor.image_processor)
            total_tokens = sum(p.num_generated for p in picked)
            optimizer.zero_grad(set_to_none=True)
            loss_sum = torch.zeros(())
            for chunk in micro_batches(sft_ranks.this_ranks_share(picked, ctx), micro_batch_size):
                batch = collate(chunk, self.spec.pad_token_id, self.spec.image_token_id)
                logprobs, _ = token_logprobs(model, batch, ctx.device, with_entropy=False)
                mask = (batch.loss_mask * batch.weights[:, None]).to(logprobs.device)
                loss = -(logprobs * mask).sum() / total_tokens * ctx.world_size
                loss.backward()
                loss_sum += loss.detach().float().cpu() / ctx.world_size
            if self.sharded:
                torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm, foreach=False)
            else:
                torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
            optimizer.step()
            schedule.step()
            loss_value = float(all_reduce(loss_sum))
            history.append({"update": update, "loss": loss_value})
            if update % 25 == 0 or update == updates:
                self.progress(f"{phase} update {update}/{updates}  nll/token {loss_value:.4f}  "
                              f"({time.perf_counter() - self.started:.0f} s)")
            if after_update is not None and after_update(update, history):
                break
        return history


def _silent(message: str) -> None:
    """Progress of ranks other than 0: they train the same updates, rank 0 reports them."""


def _keep_checkpoint(checkpoint: Path, out: Path, report: dict[str, Any], move: bool) -> None:
    """Makes an intermediate checkpoint the SFT's model: moved (or, for one `save_at` keeps, copied) next to
    `out` with the final report, then swapped in as `_save` does."""
    tmp = out.parent / f".tmp-{out.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    if move:
        checkpoint.rename(tmp)
    else:
        shutil.copytree(checkpoint, tmp)
    (tmp / "sft_report.json").write_text(json.dumps(report, indent=2))
    _swap_in(tmp, out)


def _swap_in(tmp: Path, out: Path) -> None:
    """Renames the complete model directory `tmp` to `out`, keeping the previous `out` until it is in place."""
    old = out.parent / f".old-{out.name}"
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    try:
        tmp.rename(out)
    except BaseException:
        if old.exists():
            old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)
