"""The GRPO run loop (docs/architecture.md, "One GRPO step"), read top to bottom as the algorithm.

Resumability: at the start of a run the learner saves a step-0 checkpoint; every
`checkpoint_interval` steps it saves another. A (re)started loop rolls the learner back to its
newest complete checkpoint, forgets the coordinator records of later steps and replays them: the
env draws a step's tasks from a seed that is a function of (run seed, step), so each step is
recorded exactly once.

With `grpo.async_rollout` the episodes of step s+1 are played while the learner trains on step s,
by adapter version s-1 (the one step s started from): the learner, at version s when it trains on
them, is one version ahead of the policy that sampled its batch (truncated importance sampling,
`loss.tis_cap`, corrects for it). Replicas load a new version only between two steps' sampling.
A replayed step after a restart is sampled by the restored version, so it is on-policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from services.common import tracing
from services.common.conversation import ChatTokens, Tokenizer
from services.common.trajectory import Trajectory
from services.coordinator.config import RunConfig
from services.coordinator.grpo.advantages import is_informative
from services.coordinator.grpo.credit import group_returns
from services.coordinator.grpo.episodes import (
    EpisodeResult,
    PlayPlan,
    Policy,
    Prompting,
    Sampling,
    Timers,
    invalid_fraction,
    play_episodes,
    prefix_cached_fraction,
)
from services.coordinator.grpo.evaluation import EvalPlan, eval_turn_limit, greedy_failures, run_eval
from services.coordinator.grpo.records import eval_records, train_records
from services.coordinator.grpo.sampling import STRATEGIES
from services.coordinator.grpo.tasks import (
    ConfigRefused,
    action_sequences,
    require_action_budget,
    require_env,
    task_seed,
)
from services.coordinator.grpo.trajectories import noop_fraction, to_trajectories
from services.coordinator.ops.clients import ServiceError
from services.coordinator.ops.replicas import Services
from services.coordinator.ops.store import RunState, RunStore, state_change
from services.coordinator.ops.wire import TrainResult

__all__ = ["ConfigRefused", "RunContext", "execute_run", "serve_request"]

log = logging.getLogger("mmrl.coordinator.runloop")


@dataclass
class RunContext:
    run_id: str
    config: RunConfig
    services: Services
    store: RunStore
    shared_root: Path
    tokenizer: Tokenizer
    chat: ChatTokens
    pools: int = 1  # learner pools whose runs share the rollout replicas, each with its own adapter


@dataclass(frozen=True)
class Start:
    """Where a (re)started run begins: the last completed step, the adapter version the replicas
    serve, and the eval plan."""

    step: int
    adapter_version: int
    plan: EvalPlan


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
    cfg = ctx.config
    start = await start_or_resume(ctx)  # 0. learner bound to the run and rolled back; step-0 eval
    adapter_version, checkpoint_step = start.adapter_version, start.step
    sampling = Sampling(cfg.sampling.temperature, cfg.sampling.top_p, cfg.sampling.max_tokens, start.plan.allowed)
    pending: asyncio.Task[SampledStep] | None = None  # the next step's episodes, sampled during training
    try:
        for step in range(start.step + 1, cfg.steps + 1):
            served, checkpoint_step = await serve_step_boundary(ctx, step, checkpoint_step)
            if served is not None:
                return served
            step_started = time.perf_counter()
            tracing.begin_step(ctx.run_id, step)  # one trace per step (services/common/tracing.py)

            # 1-3. B tasks (seeds from run seed + step), G episodes each, played turn by turn.
            if pending is not None:
                sampled, pending = await pending, None
            else:
                sampled = await sample_step(ctx, step, adapter_version, sampling)

            # 4. Advantages on the coordinator (credit.py); the learner only sees per-token arrays.
            trajectories = to_trajectories(sampled.groups, cfg.grpo, step)

            # 5. Train; with async_rollout the next step is sampled meanwhile, by this step's policy.
            if cfg.grpo.async_rollout and step < cfg.steps:  # (never colocated: the config refuses both)
                pending = asyncio.create_task(sample_step(ctx, step + 1, adapter_version, sampling))
            train = await train_step(ctx, trajectories, sampled.timers)
            if pending is not None:
                await asyncio.wait([pending])  # replicas load the new version between two steps' sampling

            # 6. Publish version N; every replica loads and confirms it.
            sampled_with, adapter_version = sampled.adapter_version, await publish_and_load(ctx, sampled.timers)

            # Record the step (metrics + episodes + counter) atomically.
            sampled.timers.seconds["step"] = time.perf_counter() - step_started
            metrics = step_metrics(cfg, step, sampled, trajectories, train, sampled_with, adapter_version)
            records, metrics["episodes/frames_bytes"] = train_records(
                sampled.groups, step=step, run_dir=ctx.shared_root / "runs" / ctx.run_id, settings=cfg.frames)
            await ctx.store.commit_step(ctx.run_id, step, metrics, records)
            await ctx.store.update_run(ctx.run_id, adapter_version=adapter_version)

            # 7. Eval every eval interval and at the end; 8. checkpoint every checkpoint interval.
            if step % cfg.eval.interval == 0 or step == cfg.steps:
                await evaluate(ctx, start.plan, step=step, adapter_version=adapter_version, timers=Timers())
            if step % cfg.checkpoint_interval == 0 or step == cfg.steps:
                checkpoint_step = await save_checkpoint(ctx, step)
    finally:
        if pending is not None:  # a failure or a pause: the next step is sampled again on resume
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)

    await ctx.store.set_state(ctx.run_id, RunState.SUCCEEDED)
    return RunState.SUCCEEDED


async def start_or_resume(ctx: RunContext) -> Start:
    """Checks the config against the services (the caller has checked they are up), binds the
    learner to the run and rolls it back to its newest complete checkpoint (a new run saves step 0
    first), forgets the records of later steps, has the replicas serve the restored adapter, marks
    the run running and runs the step-0 eval if it has not run."""
    cfg, run_id, svc, store = ctx.config, ctx.run_id, ctx.services, ctx.store
    env = await svc.env.info()
    require_env(cfg, env)
    require_action_budget(ctx.tokenizer, cfg.sampling.max_tokens, env.actions)
    allowed = action_sequences(cfg, ctx.tokenizer, ctx.chat, env.actions)
    if cfg.colocated and not (await svc.rollouts.model_info()).sleep_supported:
        raise ConfigRefused("colocated mode needs vLLM sleep mode, which needs a GPU; "
                            "this rollout backend does not support it (set colocated: false)")
    await svc.rollouts.require_room(ctx.pools)  # every pool's run keeps its adapter loaded there
    eval_set = await svc.env.eval_set(cfg.eval.eval_set)
    if cfg.eval.held_out_set:  # refused now (NOT_FOUND from the env), not after the last step
        await svc.env.eval_set(cfg.eval.held_out_set)
    await svc.learner.configure_run(run_id, cfg.train_settings(allowed))
    if (await store.get_run(run_id))["checkpoint_step"] < 0:
        await save_checkpoint(ctx, 0)
        start_step = 0
    else:  # GRPO steps; the learner's `step` counts optimiser steps
        start_step = (await svc.learner.load_checkpoint(run_id)).train_steps
    if cfg.colocated:  # a coordinator that stopped during a training step may have left them asleep;
        # the learner answered ConfigureRun and LoadCheckpoint after any step still running there.
        await svc.rollouts.wake_up()
    await store.truncate_after(run_id, start_step)
    adapter_version = 0 if start_step == 0 else await publish_and_load(ctx, Timers())
    await store.update_run(run_id, step=start_step, adapter_version=adapter_version)
    await store.set_state(run_id, RunState.RUNNING)
    log.info("run started", extra={"run_id": run_id, "from_step": start_step})

    eval_specs = eval_set.specs[: cfg.eval.max_tasks or None]
    plan = EvalPlan(specs=eval_specs, max_tokens=cfg.sampling.max_tokens,
                    sampled_samples=cfg.eval.sampled_samples,
                    sampled_temperature=cfg.eval.sampled_temperature,
                    max_turns=eval_turn_limit(eval_specs, cfg.env.max_moves),
                    system_prompt=cfg.system_prompt, history_window=cfg.history_window, allowed=allowed)
    if start_step == 0 and 0 not in {int(e["step"]) for e in await store.evals(run_id)}:
        await evaluate(ctx, plan, step=0, adapter_version=adapter_version, timers=Timers())
    return Start(step=start_step, adapter_version=adapter_version, plan=plan)


async def serve_step_boundary(ctx: RunContext, step: int, checkpoint_step: int) -> tuple[RunState | None, int]:
    """Pause / stop requests take effect at step boundaries, as they stand when served: a pause
    after an unsaved step saves a checkpoint first. Returns (the new state or None, the newest
    checkpoint step)."""
    store, run_id = ctx.store, ctx.run_id
    checkpointed = checkpoint_step >= step - 1
    served = await store.change_run(run_id, partial(serve_request, checkpointed=checkpointed))
    if not served and not checkpointed and await store.desired(run_id) == "pause":
        checkpoint_step = await save_checkpoint(ctx, step - 1)
        served = await store.change_run(run_id, serve_request)  # unless withdrawn meanwhile
    return (RunState(served["state"]) if served else None), checkpoint_step


async def train_step(ctx: RunContext, trajectories: list[Trajectory], timers: Timers) -> TrainResult:
    """One learner step on the batch; in colocated mode the rollout engines sleep meanwhile."""
    rollouts = ctx.services.rollouts
    if ctx.config.colocated:
        await rollouts.sleep(level=1)
    started = time.perf_counter()
    try:
        train = await ctx.services.learner.train_step(ctx.run_id, trajectories)
    except ServiceError as exc:
        # The learner refused the step (it is not training): wake the engines, keep the error.
        # Otherwise it may still be training; the run's next start wakes them after it.
        if ctx.config.colocated and exc.code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"):
            with contextlib.suppress(Exception):
                await rollouts.wake_up()
        raise
    if ctx.config.colocated:
        await rollouts.wake_up()
    timers.add("train", started)
    return train


def step_metrics(cfg: RunConfig, step: int, sampled: SampledStep, trajectories: list[Trajectory],
                 train: TrainResult, sampled_with: int, published: int) -> dict[str, Any]:
    """The step's record: rewards and episodes, groups, tokens, adapter versions, the learner's
    metrics (train/*) and the time spent on each service (time/*_s). `reward/mean` and
    `train/solve_rate` are over the groups trained on, which dynamic sampling picks for their mixed
    outcomes; `episodes/played_solve_rate` is over every episode played, so it follows the policy."""
    flat = [e for group in sampled.groups for e in group]
    played = sampled.played
    return {
        "step": step,
        "reward/mean": sum(e.reward for e in flat) / len(flat),
        "train/solve_rate": sum(e.solved for e in flat) / len(flat),
        "episodes/num": len(flat),
        "episodes/num_played": sampled.num_played,
        "episodes/played_solve_rate": sum(e.solved for e in played) / len(played),
        "episodes/turns_mean": sum(len(e.actions) for e in flat) / len(flat),
        "episodes/noop_fraction": noop_fraction(flat),
        "episodes/invalid_fraction": invalid_fraction(flat),
        "rollout/prefix_cached_fraction": prefix_cached_fraction(flat),
        "groups/num": len(sampled.groups),
        "groups/num_informative": sum(is_informative(group_returns(g, cfg.grpo.discount)) for g in sampled.groups),
        "groups/num_dropped": sampled.num_dropped,
        "tokens/generated": sum(sum(t.loss_mask) for t in trajectories),
        "adapter/sampled_with": sampled_with,
        "adapter/published": published,
        "train/skipped": train.skipped,
        # Non-finite values (a skipped step's loss or grad norm) become null: JSON has no NaN.
        **{k if "/" in k else f"train/{k}": (v if math.isfinite(v) else None) for k, v in train.metrics.items()},
        **{f"time/{k}_s": v for k, v in sampled.timers.seconds.items()},
    }


@dataclass
class SampledStep:
    """The groups of one step and what sampling them took."""

    groups: list[list[EpisodeResult]]
    adapter_version: int
    dropped: list[list[EpisodeResult]]  # groups played but not trained on (all rewards equal)
    timers: Timers

    @property
    def num_dropped(self) -> int:
        return len(self.dropped)

    @property
    def played(self) -> list[EpisodeResult]:
        """Every episode of the step, trained on or dropped: fresh tasks, none chosen by outcome."""
        return [e for group in (*self.groups, *self.dropped) for e in group]

    @property
    def num_played(self) -> int:
        return len(self.played)


@tracing.traced("sample")
async def sample_step(ctx: RunContext, step: int, adapter_version: int, sampling: Sampling) -> SampledStep:
    """Plays the B groups of one step with one adapter version, in rounds as the run's group sampling
    strategy says (sampling.py): each round plays the tasks still needed plus the strategy's extra ones;
    the groups it keeps fill the batch in play order, and after the last round the others fill what is
    left."""
    cfg = ctx.config
    strategy = STRATEGIES[cfg.grpo.group_sampling]
    wanted = cfg.grpo.tasks_per_step
    timers = Timers()
    groups: list[list[EpisodeResult]] = []
    passed_over: list[list[EpisodeResult]] = []
    dropped: list[list[EpisodeResult]] = []
    prompting = Prompting(ctx.tokenizer, ctx.chat, cfg.system_prompt, cfg.history_window)
    rounds = strategy.rounds(cfg.grpo)
    for round_index in range(rounds):
        needed = wanted - len(groups)
        specs = await ctx.services.env.training_tasks(
            task_seed(cfg.seed, step, round_index), needed + strategy.extra_tasks(cfg.grpo),
            cfg.env.max_moves, cfg.env.options)
        episodes = await play_episodes(ctx.services, prompting, Policy(ctx.run_id, adapter_version), PlayPlan(
            specs, samples_per_spec=cfg.grpo.group_size, sampling=sampling, max_turns=cfg.turn_limit,
            seed=cfg.seed * 100_003 + step * 101 + round_index, greedy_per_spec=cfg.grpo.greedy_per_group,
            keep_frames=cfg.frames.train != "off"), timers)
        kept: list[list[EpisodeResult]] = []
        passed_over = []
        for g in range(len(specs)):
            group = episodes[g * cfg.grpo.group_size:(g + 1) * cfg.grpo.group_size]
            (kept if strategy.keeps(group, cfg.grpo) else passed_over).append(group)
        groups.extend(kept[:needed])
        dropped.extend(kept[needed:])
        if len(groups) >= wanted or round_index == rounds - 1:
            break
        dropped.extend(passed_over)
    filler = wanted - len(groups)
    groups.extend(passed_over[:filler])  # no signal, but a full batch
    dropped.extend(passed_over[filler:])
    return SampledStep(groups=groups, adapter_version=adapter_version, dropped=dropped, timers=timers)


@tracing.traced("sync")
async def publish_and_load(ctx: RunContext, timers: Timers) -> int:
    """Learner publishes version N; every rollout replica loads and confirms it."""
    started = time.perf_counter()
    published = await ctx.services.learner.publish(ctx.run_id)
    await ctx.services.rollouts.load_adapter(ctx.run_id, published.version, published.path,
                                             published.manifest_sha256)
    timers.add("sync", started)
    await ctx.store.add_event(ctx.run_id, "adapter", {"version": published.version, "path": published.path})
    return published.version


@tracing.traced("eval")
async def evaluate(ctx: RunContext, plan: EvalPlan, *, step: int, adapter_version: int, timers: Timers) -> None:
    started = time.perf_counter()
    keep = ctx.config.eval.save_frames
    summary, greedy = await run_eval(ctx.services, ctx.tokenizer, ctx.chat, plan, run_id=ctx.run_id,
                                     adapter_version=adapter_version, seed=ctx.config.seed + 7 * step,
                                     timers=timers, keep_frames=keep)
    summary["eval_s"] = time.perf_counter() - started
    held_out = ctx.config.eval.held_out_set
    if held_out and step in (0, ctx.config.steps):  # tasks outside the fixed set: the start and the final policy
        held_out_started = time.perf_counter()
        specs = list((await ctx.services.env.eval_set(held_out)).specs)
        held_out_plan = replace(plan, specs=specs, sampled_samples=0,
                                max_turns=eval_turn_limit(specs, ctx.config.env.max_moves))
        held_out_summary, _ = await run_eval(ctx.services, ctx.tokenizer, ctx.chat, held_out_plan, run_id=ctx.run_id,
                                             adapter_version=adapter_version, seed=ctx.config.seed + 7 * step,
                                             timers=timers)
        # A measurement beside the run, not GRPO's work: its time is kept apart from eval_s, which the
        # time budget of `mmrl demo` counts.
        summary.update({"held_out_set": held_out, "held_out_episodes": held_out_summary["episodes"],
                        "held_out_solve_rate": held_out_summary["greedy_solve_rate"],
                        **{f"held_out_failed_{mode}": share for mode, share in greedy_failures(held_out_summary).items()},
                        "held_out_eval_s": time.perf_counter() - held_out_started})
    summary["step"] = step
    records, summary["frames_bytes"] = eval_records(greedy, step=step, run_dir=ctx.shared_root / "runs" / ctx.run_id,
                                                    keep_frames=keep)
    await ctx.store.record_eval(ctx.run_id, step, summary, records)
    log.info("eval", extra={"run_id": ctx.run_id, **summary})


@tracing.traced("checkpoint")
async def save_checkpoint(ctx: RunContext, step: int) -> int:
    """The learner's checkpoint of GRPO step `step` (its current state), recorded with the run."""
    await ctx.services.learner.save_checkpoint(ctx.run_id)
    await ctx.store.update_run(ctx.run_id, checkpoint_step=step)
    return step
