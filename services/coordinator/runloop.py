"""The GRPO run loop (ARCHITECTURE "One GRPO step"), read top to bottom as the algorithm.

Resumability: at the start of a run the learner saves a step-0 checkpoint; every
`checkpoint_interval` steps it saves another. A (re)started loop rolls the learner back to its
newest complete checkpoint, forgets the coordinator records of later steps and replays them: the
maze seeds of a step are a function of (run seed, step), so each step is recorded exactly once.

With `grpo.async_rollout` the episodes of step s+1 are played while the learner trains on step s,
by adapter version s-1 (the one step s started from): the learner, at version s when it trains on
them, is one version ahead of the policy that sampled its batch (truncated importance sampling,
`grpo.tis_cap`, corrects for it). Replicas load a new version only between two steps' sampling.
A replayed step after a restart is sampled by the restored version, so it is on-policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from mmrl.v1 import env_pb2, learner_pb2, rollout_pb2
from services.common import tracing
from services.common.conversation import ChatTokens, Tokenizer
from services.common.maze import ACTIONS, TRAIN_SEED_LIMIT, is_eval_layout, layout_key, num_cells_per_side
from services.common.trajectory import Trajectory
from services.coordinator import hindsight
from services.coordinator.advantages import (
    Normalize,
    PathCredit,
    discounted_return,
    group_advantages,
    is_informative,
    loop_erased_turns,
    noop_turns,
    path_advantages,
    per_turn_token_advantages,
    returns_to_go,
    step_advantages,
)
from services.coordinator.clients import ServiceError, Services
from services.coordinator.config import EnvSettings, RunConfig
from services.coordinator.episodes import (
    EpisodeResult,
    Sampling,
    Timers,
    invalid_fraction,
    play_episodes,
    prefix_cached_fraction,
)
from services.coordinator.evaluation import EvalPlan, episode_record, eval_turn_limit, run_eval
from services.coordinator.store import RunState, RunStore, state_change

log = logging.getLogger("mmrl.coordinator.runloop")


class ConfigRefused(ValueError):
    """The run config cannot run on these services (e.g. colocated mode without sleep support)."""


@dataclass
class RunContext:
    run_id: str
    config: RunConfig
    services: Services
    store: RunStore
    shared_root: Path
    tokenizer: Tokenizer
    chat: ChatTokens


def step_seeds(run_seed: int, step: int, round_index: int, count: int, size: int,
               exclude_layouts: frozenset[bytes] = frozenset()) -> list[int]:
    """Maze seeds of one sampling round of a step, a pure function of its arguments: distinct
    training seeds whose layouts at `size` are neither reserved for eval sets nor in `exclude_layouts`."""
    rng = random.Random(f"mmrl:{run_seed}:{step}:{round_index}")
    seeds: list[int] = []
    for draws in itertools.count():
        if len(seeds) == count:
            break
        if draws == 1000 * count:  # e.g. a 2x2-cell maze has 4 layouts, and an eval set may hold them
            raise ConfigRefused(f"found {len(seeds)} of {count} training mazes in {draws} draws: at size {size} "
                                "nearly every layout is reserved for eval sets or in the run's eval set")
        seed = rng.randrange(TRAIN_SEED_LIMIT)
        key = layout_key(seed, size)
        if not is_eval_layout(key) and key not in exclude_layouts and seed not in seeds:
            seeds.append(seed)
    return seeds


def require_action_budget(tokenizer: Tokenizer, max_tokens: int) -> None:
    """Refuses a token budget too small for an action word, which would cut every such move to an
    invalid action: `sampling.max_tokens: 1` is right only where every action word is one token."""
    for word in ACTIONS:
        length = len(tokenizer.encode(word, add_special_tokens=False))
        if length > max_tokens:
            raise ConfigRefused(f"sampling.max_tokens {max_tokens} cannot hold the action {word!r}, "
                                f"{length} tokens with this model's tokenizer")


def spec_layouts(specs: Iterable[env_pb2.EpisodeSpec], default_size: int) -> frozenset[bytes]:
    """The layout keys of these mazes (a spec without a size option has the run's)."""
    return frozenset(layout_key(spec.seed, int(spec.options.get("size", default_size))) for spec in specs)


def training_options(env: EnvSettings, run_seed: int, step: int, round_index: int, maze_seed: int) -> dict[str, str]:
    """Env options of one training maze: the run's, and with `env.random_start` p, for a share p
    of the mazes, a start cell drawn uniformly among the cells other than the goal (exploring
    starts; all G episodes of the group start there). A pure function of its arguments, so a
    replayed step plays the same episodes."""
    options = env.spec_options()
    if env.random_start == 0.0:
        return options
    rng = random.Random(f"mmrl:{run_seed}:{step}:{round_index}:{maze_seed}:start")
    if rng.random() >= env.random_start:
        return options
    goal, side = env.goal_cell(), num_cells_per_side(env.size)
    cells = [(r, c) for r in range(side) for c in range(side) if (r, c) != goal]
    row, col = rng.choice(cells)
    return {**options, "start": f"{row},{col}"}


def group_returns(group: list[EpisodeResult], discount: float) -> list[float]:
    """The returns the advantages of a group are computed from (the reward, discounted by turns)."""
    return [discounted_return(e.reward, max(1, len(e.actions)), discount) for e in group]


def turn_advantages(
    group: list[EpisodeResult], normalize: Normalize, discount: float = 1.0, step_weight: float = 0.0,
    noop_penalty: float = 0.0, path_credit: PathCredit = "off", invalid_penalty: float = 0.0,
) -> list[list[float]]:
    """Per episode, the advantage of each turn (see advantages.py): the episode's group-relative
    advantage (with `path_credit`, a winner's only on its loop-erased path), plus `step_weight`
    times the step-level advantage among the group's turns taken from the same observation
    (GiGPO), minus `noop_penalty` on the turns that changed nothing and `invalid_penalty` on the
    turns whose action the env could not read."""
    episode = group_advantages(group_returns(group, discount), normalize)
    turns = [len(e.actions) for e in group]
    per_turn = [[a] * n if path_credit == "off" else
                path_advantages(a, loop_erased_turns(e.observation_keys, n), path_credit)
                for a, e, n in zip(episode, group, turns, strict=True)]
    if step_weight != 0.0:
        steps = step_advantages([e.observation_keys[:n] for e, n in zip(group, turns, strict=True)],
                                [returns_to_go(e.reward, n, discount) for e, n in zip(group, turns, strict=True)],
                                normalize)
        per_turn = [[a + step_weight * s for a, s in zip(base, step, strict=True)]
                    for base, step in zip(per_turn, steps, strict=True)]
    if noop_penalty != 0.0:
        per_turn = [[a - noop_penalty * noop for a, noop in zip(base, noop_turns(e.observation_keys, n), strict=True)]
                    for base, e, n in zip(per_turn, group, turns, strict=True)]
    if invalid_penalty != 0.0:
        per_turn = [[a - invalid_penalty * bad for a, bad in zip(base, e.invalid_turns, strict=True)]
                    for base, e in zip(per_turn, group, strict=True)]
    return per_turn


def noop_fraction(episodes: list[EpisodeResult]) -> float:
    """The share of the episodes' turns that changed nothing (wall bumps in the maze)."""
    flags = [f for e in episodes for f in noop_turns(e.observation_keys, len(e.actions))]
    return sum(flags) / len(flags) if flags else 0.0


def to_trajectories(
    groups: list[list[EpisodeResult]], normalize: Normalize, step: int, discount: float = 1.0,
    step_weight: float = 0.0, noop_penalty: float = 0.0, path_credit: PathCredit = "off",
    invalid_penalty: float = 0.0,
) -> list[Trajectory]:
    trajectories = []
    for g, group in enumerate(groups):
        advantages = turn_advantages(group, normalize, discount, step_weight, noop_penalty, path_credit,
                                     invalid_penalty)
        for k, (episode, turns) in enumerate(zip(group, advantages, strict=True)):
            conv = episode.conversation
            trajectories.append(conv.to_trajectory(
                f"s{step}-g{g}-e{k}", per_turn_token_advantages(turns, conv.loss_mask, conv.turn_starts),
                reward=episode.reward, adapter_version=episode.adapter_version, group_id=f"s{step}-g{g}",
            ))
    return trajectories


def serve_request(run: dict[str, Any], checkpointed: bool = True) -> dict[str, Any]:
    """At a step boundary: the fields that stop the run when that is asked, or pause it when that is
    asked and the last completed step is `checkpointed` (so that a resume replays nothing); else none."""
    if run["desired"] == "stop":
        return state_change(RunState.STOPPED)
    if run["desired"] == "pause" and checkpointed:
        return state_change(RunState.PAUSED)
    return {}


async def execute_run(ctx: RunContext) -> RunState:
    """Runs (or resumes) a run until it finishes, is paused or is stopped; returns the new state.
    Raises on failure (the caller records the reason)."""
    cfg, run_id, svc, store = ctx.config, ctx.run_id, ctx.services, ctx.store

    # 0. (The caller has checked that every service is up.) Config possible on them, learner bound
    #    to the run and rolled back.
    require_action_budget(ctx.tokenizer, cfg.sampling.max_tokens)
    if cfg.colocated:
        info = await svc.rollouts[0].call("GetModelInfo", svc.rollouts[0].stub.GetModelInfo,
                                          rollout_pb2.GetModelInfoRequest())
        if not info.sleep_supported:
            raise ConfigRefused("colocated mode needs vLLM sleep mode, which needs a GPU; "
                                "this rollout backend does not support it (set colocated: false)")
    eval_set = await svc.env.call("GetEvalSet", svc.env.stub.GetEvalSet,
                                  env_pb2.GetEvalSetRequest(name=cfg.eval.eval_set))
    # Eval sets hold only layouts reserved for them, which training skips; the run's set is excluded by
    # layout as well, so that no maze it evaluates on is trained on even if a set broke that rule.
    eval_layouts = spec_layouts(eval_set.specs, cfg.env.size)
    learner = svc.learner
    await learner.call("ConfigureRun", learner.stub.ConfigureRun, learner_pb2.ConfigureRunRequest(
        run_id=run_id, config_json=json.dumps(cfg.learner_config())))
    run = await store.get_run(run_id)
    if run["checkpoint_step"] < 0:
        await save_checkpoint(ctx, 0)
        start_step = 0
    else:
        state = await learner.call("LoadCheckpoint", learner.stub.LoadCheckpoint,
                                   learner_pb2.LoadCheckpointRequest(run_id=run_id))
        start_step = int(state.train_steps)  # GRPO steps; `state.step` counts optimiser steps
    if cfg.colocated:  # a coordinator that stopped during a training step may have left them asleep;
        # the learner answered ConfigureRun and LoadCheckpoint after any step still running there.
        await _all_rollouts(ctx, "WakeUp", rollout_pb2.WakeUpRequest())
    await store.truncate_after(run_id, start_step)
    adapter_version = 0 if start_step == 0 else await publish_and_load(ctx, Timers())
    await store.update_run(run_id, step=start_step, adapter_version=adapter_version)
    await store.set_state(run_id, RunState.RUNNING)
    log.info("run started", extra={"run_id": run_id, "from_step": start_step})

    eval_specs = list(eval_set.specs)[: cfg.eval.max_tasks or None]
    plan = EvalPlan(specs=eval_specs, max_tokens=cfg.sampling.max_tokens,
                    sampled_samples=cfg.eval.sampled_samples,
                    sampled_temperature=cfg.eval.sampled_temperature,
                    max_turns=eval_turn_limit(eval_specs, cfg.env.max_moves),
                    system_prompt=cfg.system_prompt)
    evals_done = {int(e["step"]) for e in await store.evals(run_id)}
    if start_step == 0 and 0 not in evals_done:
        await evaluate(ctx, plan, step=0, adapter_version=adapter_version, timers=Timers())

    sampling = Sampling(cfg.sampling.temperature, cfg.sampling.top_p, cfg.sampling.max_tokens)
    pending: asyncio.Task[SampledStep] | None = None  # the next step's episodes, sampled during training
    checkpoint_step = start_step  # the learner's newest checkpoint
    try:
        for step in range(start_step + 1, cfg.steps + 1):
            # Pause / stop requests take effect at step boundaries, as they stand when served.
            checkpointed = checkpoint_step >= step - 1
            served = await store.change_run(run_id, partial(serve_request, checkpointed=checkpointed))
            if not served and not checkpointed and await store.desired(run_id) == "pause":
                checkpoint_step = await save_checkpoint(ctx, step - 1)
                served = await store.change_run(run_id, serve_request)  # unless withdrawn meanwhile
            if served:
                return RunState(served["state"])
            step_started = time.perf_counter()
            tracing.begin_step(run_id, step)  # one trace per step (services/common/tracing.py)

            # 1-3. B mazes (seeds from run seed + step), G episodes each, played turn by turn.
            if pending is not None:
                sampled, pending = await pending, None
            else:
                sampled = await sample_step(ctx, step, adapter_version, sampling, eval_layouts)
            groups, timers = sampled.groups, sampled.timers

            # 4. Group-relative advantages on the coordinator; the learner only sees per-token arrays.
            trajectories = to_trajectories(groups, cfg.grpo.advantage_norm, step, cfg.grpo.discount,
                                           cfg.grpo.step_advantage_weight, cfg.grpo.noop_penalty,
                                           cfg.grpo.path_credit, cfg.grpo.invalid_penalty)
            #    With hindsight relabelling, failed episodes replayed to where they ended (and/or solved
            #    ones along their clean way), spread over the mini-batches.
            relabelled: list[Trajectory] = []
            if cfg.grpo.hindsight_advantage > 0.0:
                relabels = hindsight.select(groups + sampled.dropped, cfg.grpo.hindsight_max_episodes,
                                            cfg.grpo.hindsight_episodes)
                convs = await hindsight.replay(svc, ctx.tokenizer, ctx.chat, relabels,
                                               system_prompt=cfg.system_prompt, timers=timers)
                relabelled = hindsight.to_trajectories(convs, cfg.grpo.hindsight_advantage, step,
                                                       sampled.adapter_version)

            # 5. Train (rollout engine asleep in colocated mode; with async_rollout the next step is
            #    sampled meanwhile, by the policy of this step's start), publish, 6. load on every replica.
            if cfg.colocated:
                await _all_rollouts(ctx, "Sleep", rollout_pb2.SleepRequest(level=1))
            started = time.perf_counter()
            training = asyncio.create_task(learner.call(
                "TrainStep", learner.stub.TrainStep,
                learner_pb2.TrainStepRequest(run_id=run_id, trajectories=[
                    t.to_proto() for t in interleave(trajectories, relabelled)])))
            if cfg.grpo.async_rollout and step < cfg.steps:  # (never colocated: the config refuses both)
                pending = asyncio.create_task(sample_step(ctx, step + 1, adapter_version, sampling, eval_layouts))
            try:
                train = await training
            except ServiceError as exc:
                # The learner refused the step (it is not training): wake the engines, keep the error.
                # Otherwise it may still be training; the run's next start wakes them after it.
                if cfg.colocated and exc.code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"):
                    with contextlib.suppress(Exception):
                        await _all_rollouts(ctx, "WakeUp", rollout_pb2.WakeUpRequest())
                raise
            if cfg.colocated:
                await _all_rollouts(ctx, "WakeUp", rollout_pb2.WakeUpRequest())
            timers.add("train", started)
            sampled_with = sampled.adapter_version
            if pending is not None:
                await asyncio.wait([pending])  # replicas load the new version between two steps' sampling
            adapter_version = await publish_and_load(ctx, timers)

            # Record the step (metrics + episodes + counter) atomically.
            flat = [e for group in groups for e in group]
            rewards = [e.reward for e in flat]
            metrics: dict[str, Any] = {
                "step": step,
                "reward/mean": sum(rewards) / len(rewards),
                "train/solve_rate": sum(e.solved for e in flat) / len(flat),
                "episodes/num": len(flat),
                "episodes/num_played": sampled.num_played,
                "episodes/turns_mean": sum(len(e.actions) for e in flat) / len(flat),
                "episodes/noop_fraction": noop_fraction(flat),
                "episodes/invalid_fraction": invalid_fraction(flat),
                "rollout/prefix_cached_fraction": prefix_cached_fraction(flat),
                "groups/num": len(groups),
                "groups/num_informative": sum(
                    is_informative(group_returns(g, cfg.grpo.discount)) for g in groups),
                "groups/num_dropped": sampled.num_dropped,
                "hindsight/num": len(relabelled),
                "tokens/generated": sum(sum(t.loss_mask) for t in trajectories),
                "adapter/sampled_with": sampled_with,
                "adapter/published": adapter_version,
                "train/skipped": bool(train.skipped),
                # Non-finite values (a skipped step's loss or grad norm) become null: JSON has no NaN.
                **{k if "/" in k else f"train/{k}": (v if math.isfinite(v) else None)
                   for k, v in train.metrics.items()},
            }
            records = {e.episode_id: episode_record(e, step=step, kind="train") for e in flat}
            timers.seconds["step"] = time.perf_counter() - step_started
            metrics.update({f"time/{k}_s": v for k, v in timers.seconds.items()})
            await store.commit_step(run_id, step, metrics, records)
            await store.update_run(run_id, adapter_version=adapter_version)

            # 7. Eval every eval interval and at the end; 8. checkpoint every checkpoint interval.
            if step % cfg.eval.interval == 0 or step == cfg.steps:
                await evaluate(ctx, plan, step=step, adapter_version=adapter_version, timers=Timers())
            if step % cfg.checkpoint_interval == 0 or step == cfg.steps:
                checkpoint_step = await save_checkpoint(ctx, step)
    finally:
        if pending is not None:  # a failure or a pause: the next step is sampled again on resume
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)

    await store.set_state(run_id, RunState.SUCCEEDED)
    return RunState.SUCCEEDED


@dataclass
class SampledStep:
    """The groups of one step and what sampling them took."""

    groups: list[list[EpisodeResult]]
    adapter_version: int
    dropped: list[list[EpisodeResult]]  # groups played but not trained on (all rewards equal)
    num_played: int
    timers: Timers

    @property
    def num_dropped(self) -> int:
        return len(self.dropped)


@tracing.traced("sample")
async def sample_step(ctx: RunContext, step: int, adapter_version: int, sampling: Sampling,
                      eval_layouts: frozenset[bytes]) -> SampledStep:
    """Plays the B groups of one step with one adapter version. With dynamic sampling, each round
    plays the mazes still needed plus `extra_mazes`; groups whose rewards are all equal are
    dropped, and the informative ones fill the batch in play order. After `max_sampling_rounds`
    rounds, dropped groups of the last round fill what is left."""
    cfg = ctx.config
    timers = Timers()
    groups: list[list[EpisodeResult]] = []
    uninformative: list[list[EpisodeResult]] = []
    dropped: list[list[EpisodeResult]] = []
    num_played = 0
    dynamic = cfg.grpo.dynamic_sampling
    rounds = cfg.grpo.max_sampling_rounds if dynamic else 1
    for round_index in range(rounds):
        needed = cfg.grpo.mazes_per_step - len(groups)
        seeds = step_seeds(cfg.seed, step, round_index, needed + (cfg.grpo.extra_mazes if dynamic else 0),
                           cfg.env.size, eval_layouts)
        specs = [env_pb2.EpisodeSpec(seed=s, max_moves=cfg.env.max_moves,
                                     options=training_options(cfg.env, cfg.seed, step, round_index, s))
                 for s in seeds]
        episodes = await play_episodes(
            ctx.services, ctx.tokenizer, ctx.chat, specs, samples_per_spec=cfg.grpo.group_size,
            sampling=sampling, run_id=ctx.run_id, adapter_version=adapter_version,
            system_prompt=cfg.system_prompt, max_turns=cfg.turn_limit,
            seed=cfg.seed * 100_003 + step * 101 + round_index, timers=timers,
            greedy_per_spec=cfg.grpo.greedy_per_group)
        num_played += len(episodes)
        keep: list[list[EpisodeResult]] = []
        uninformative = []
        for g in range(len(seeds)):
            group = episodes[g * cfg.grpo.group_size:(g + 1) * cfg.grpo.group_size]
            informative = not dynamic or is_informative(group_returns(group, cfg.grpo.discount))
            (keep if informative else uninformative).append(group)
        groups.extend(keep[:needed])
        dropped.extend(keep[needed:])
        if len(groups) >= cfg.grpo.mazes_per_step or round_index == rounds - 1:
            break
        dropped.extend(uninformative)
    filler = cfg.grpo.mazes_per_step - len(groups)
    groups.extend(uninformative[:filler])  # no signal, but a full batch
    dropped.extend(uninformative[filler:])
    return SampledStep(groups=groups, adapter_version=adapter_version, dropped=dropped,
                       num_played=num_played, timers=timers)


def interleave(main: list[Trajectory], extra: list[Trajectory]) -> list[Trajectory]:
    """`main` in order with `extra` spread evenly through it, so that the learner's contiguous
    mini-batches each get their share of both."""
    keyed = [((i + 1) / (len(main) + 1), 0, t) for i, t in enumerate(main)]
    keyed += [((j + 1) / (len(extra) + 1), 1, t) for j, t in enumerate(extra)]
    return [t for *_, t in sorted(keyed, key=lambda k: (k[0], k[1]))]


@tracing.traced("sync")
async def publish_and_load(ctx: RunContext, timers: Timers) -> int:
    """Learner publishes version N; every rollout replica loads and confirms it."""
    started = time.perf_counter()
    learner = ctx.services.learner
    published = await learner.call("PublishAdapter", learner.stub.PublishAdapter,
                                   learner_pb2.PublishAdapterRequest(run_id=ctx.run_id))
    for replica in ctx.services.rollouts:
        await replica.load_adapter(ctx.run_id, int(published.version), published.path, published.manifest_sha256)
    timers.add("sync", started)
    await ctx.store.add_event(ctx.run_id, "adapter", {"version": int(published.version), "path": published.path})
    return int(published.version)


@tracing.traced("eval")
async def evaluate(ctx: RunContext, plan: EvalPlan, *, step: int, adapter_version: int, timers: Timers) -> None:
    started = time.perf_counter()
    keep = ctx.config.eval.save_frames
    summary, greedy = await run_eval(ctx.services, ctx.tokenizer, ctx.chat, plan, run_id=ctx.run_id,
                                     adapter_version=adapter_version, seed=ctx.config.seed + 7 * step,
                                     timers=timers, keep_frames=keep)
    summary.update({"step": step, "eval_s": time.perf_counter() - started})
    frames_root = ctx.shared_root / "runs" / ctx.run_id / "episodes" / f"eval_step_{step:06d}"
    records = {
        f"eval-{step}-{i}": {**episode_record(e, step=step, kind="eval",
                                                frame_dir=frames_root / f"{i:03d}" if keep else None),
                              "id": f"eval-{step}-{i}"}
        for i, e in enumerate(greedy)
    }
    await ctx.store.record_eval(ctx.run_id, step, summary, records)
    log.info("eval", extra={"run_id": ctx.run_id, **summary})


@tracing.traced("checkpoint")
async def save_checkpoint(ctx: RunContext, step: int) -> int:
    """The learner's checkpoint of GRPO step `step` (its current state), recorded with the run."""
    await ctx.services.learner.call("SaveCheckpoint", ctx.services.learner.stub.SaveCheckpoint,
                                    learner_pb2.SaveCheckpointRequest(run_id=ctx.run_id))
    await ctx.store.update_run(ctx.run_id, checkpoint_step=step)
    return step


async def _all_rollouts(ctx: RunContext, method: str, request: Any) -> None:
    for replica in ctx.services.rollouts:
        await replica.call(method, getattr(replica.stub, method), request)
