"""A finished tiny run for the console's tests, recorded without vLLM or a learner.

Episodes are played by `episodes.play_episodes` on a real env service (the maze, its real
renderer), with a scripted policy standing in for the rollout engine: it reads the frame it is
shown, and takes the maze's optimal move with a probability that grows with the step (else a
wrong move, or now and then text the env cannot read). The records and frames are written by
`records.py` and the run is recorded through RunStore's own methods, as the run loop records a
run; the adapter versions are placeholder files published with storage's manifest.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

from services.common import storage
from services.common.conversation import expand_image_placeholders
from services.common.task import TaskSpec
from services.coordinator.config import FrameSettings, RunConfig
from services.coordinator.grpo.episodes import PlayPlan, Policy, Prompting, Sampling, Timers, play_episodes
from services.coordinator.grpo.evaluation import solve_rate
from services.coordinator.grpo.records import eval_records, train_records
from services.coordinator.ops.replicas import Envs, Rollouts, Services
from services.coordinator.ops.store import RunState, RunStore
from services.coordinator.ops.wire import Generation, Prompt
from services.env.maze.env import MazeEnv
from tests.coordinator.chat import CHAT, CharTokenizer

SIZE, MAX_MOVES = 9, 16
TRAIN_SEEDS = {1: [11, 12], 2: [13, 14], 3: [15, 16]}  # step -> mazes (2 groups of 4 episodes)
EVAL_SEEDS = [21, 22, 23, 24]
SKILL = {0: 0.3, 1: 0.55, 2: 0.75, 3: 0.9}  # after step s, the chance of the optimal move


class ScriptedPolicy:
    """A rollout stand-in that answers from the frame: every frame of the mazes it knows maps to
    the optimal move there."""

    def __init__(self, seeds: list[int]) -> None:
        self.skill = 0.0
        self.optimal: dict[bytes, str] = {}
        env = MazeEnv()
        for seed in seeds:
            for row in range(SIZE // 2):
                for col in range(SIZE // 2):
                    options = {"size": str(SIZE), "start": f"{row},{col}"}
                    if (row, col) == (SIZE // 2 - 1, SIZE // 2 - 1):
                        continue  # the goal
                    [view] = env.create([TaskSpec(seed=seed, max_moves=MAX_MOVES, options=options)])
                    self.optimal[view.frame_png] = str(view.info["optimal_action"])

    def _answer(self, frame: bytes, turn: int, seed: int) -> str:
        rng = random.Random(hashlib.sha256(frame + f"{turn}:{seed}:{self.skill}".encode()).digest())
        best = self.optimal.get(frame, "stop")
        if rng.random() < self.skill:
            return best
        if rng.random() < 0.15:
            return "downright"  # the env cannot read it
        return rng.choice([a for a in ("up", "down", "left", "right") if a != best])

    async def generate(self, prompts: list[Prompt]) -> list[Generation]:
        results = []
        for p in prompts:
            text = self._answer(p.images[-1], len(p.images), p.sampling.seed)
            tokens = [*CharTokenizer().encode(text), CHAT.im_end]
            rng = random.Random(text + str(len(p.images)))
            results.append(Generation(
                prompt_token_ids=expand_image_placeholders(p.token_ids, CHAT.image_pad, [3] * len(p.images)),
                token_ids=tokens, text=text, logprobs=[-rng.uniform(0.01, 1.5) for _ in tokens],
                adapter_version=p.adapter_version))
        return results


def _publish_adapter(shared_root: Path, run_id: str, version: int) -> None:
    def write(directory: Path) -> None:
        (directory / storage.ADAPTER_WEIGHTS).write_bytes(bytes(4096 * version))
        (directory / storage.ADAPTER_CONFIG).write_text('{"r": 8}')

    storage.publish_directory(storage.adapter_dir(shared_root, run_id, version), write)


async def record_finished_run(store: RunStore, env: Any, shared_root: Path, run_id: str = "console-tiny") -> str:
    """Plays and records a 3-step run with evals at steps 0 and 3; returns its id."""
    config = RunConfig(name="console tiny", model="tiny-model", steps=3,
                       frames=FrameSettings(train="groups", train_groups=1))
    config.eval.interval = 3
    config.grpo.tasks_per_step, config.grpo.group_size = 2, 4
    config.env.options, config.env.max_moves = {"size": str(SIZE)}, MAX_MOVES
    await store.create_run(run_id, config.name, config.model_dump(mode="json"), config.steps)
    await store.set_state(run_id, RunState.RUNNING)
    policy = ScriptedPolicy([s for seeds in TRAIN_SEEDS.values() for s in seeds] + EVAL_SEEDS)
    envs = env if isinstance(env, Envs) else Envs([env])
    services = Services(env=envs, rollouts=Rollouts([policy]), learner=None)  # type: ignore[list-item, arg-type]
    run_dir = storage.run_dir(shared_root, run_id)

    async def play(seeds: list[int], samples: int, version: int, seed: int) -> list[Any]:
        specs = [TaskSpec(seed=s, max_moves=MAX_MOVES, options={"size": str(SIZE)}) for s in seeds]
        return await play_episodes(services, Prompting(CharTokenizer(), CHAT, ""), Policy(run_id, version),
                                   PlayPlan(specs, samples_per_spec=samples, sampling=Sampling(1.0, 1.0, 8),
                                            max_turns=MAX_MOVES, seed=seed, keep_frames=True), Timers())

    async def evaluate(step: int, version: int) -> None:
        policy.skill = SKILL[step]
        greedy = await play(EVAL_SEEDS, 1, version, seed=7 * step)
        records, size = eval_records(greedy, step=step, run_dir=run_dir, keep_frames=True)
        summary = {"step": step, "adapter_version": version, "episodes": len(greedy),
                   "greedy_solve_rate": solve_rate(greedy), "sampled_solve_rate": min(1.0, solve_rate(greedy) + 0.1),
                   "frames_bytes": size}
        await store.record_eval(run_id, step, summary, records)

    await evaluate(0, 0)
    for step, seeds in TRAIN_SEEDS.items():
        policy.skill = SKILL[step - 1]
        played = await play(seeds, config.grpo.group_size, step - 1, seed=step)
        groups = [played[i:i + config.grpo.group_size] for i in range(0, len(played), config.grpo.group_size)]
        records, size = train_records(groups, step=step, run_dir=run_dir, settings=config.frames)
        metrics = {"step": step, "reward/mean": sum(e.reward for e in played) / len(played),
                   "train/solve_rate": solve_rate(played), "episodes/frames_bytes": size,
                   "time/rollout_s": 1.0 + 0.1 * step, "time/env_s": 0.2, "time/train_s": 2.0 - 0.2 * step,
                   "time/sync_s": 0.3, "time/step_s": 3.5}
        await store.commit_step(run_id, step, metrics, records)
        _publish_adapter(shared_root, run_id, step)
        await store.add_event(run_id, "adapter", {"version": step})
        await store.update_run(run_id, adapter_version=step, checkpoint_step=step)
    await evaluate(3, 3)
    await store.set_state(run_id, RunState.SUCCEEDED)
    return run_id


async def record_with_env_server(redis_url: str, shared_root: Path, run_id: str = "console-tiny") -> str:
    """`record_finished_run` with its own env service on loopback (for tests that are not async)."""
    from mmrl_proto.v1 import env_pb2_grpc
    from services.common.grpc_server import start_server
    from services.coordinator.ops.clients import CallPolicy, EnvClient
    from services.env.config import EnvConfig
    from services.env.servicer import SERVICE_NAME, EnvServicer

    servicer = EnvServicer(MazeEnv(EnvConfig(max_live_episodes=64, max_batch=64)))
    running = await start_server(
        lambda server: env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, server), SERVICE_NAME, "127.0.0.1:0")
    env = EnvClient(f"127.0.0.1:{running.port}", CallPolicy(retries=0))
    store = RunStore.from_url(redis_url)
    try:
        await store.r.flushdb()
        return await record_finished_run(store, env, shared_root, run_id)
    finally:
        await store.close()
        await env.close()
        await running.stop(grace_s=0)
