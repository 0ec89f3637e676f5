"""The chance baseline of an environment: how often a policy that picks every turn's action uniformly
from the env's action words (GetEnvInfo `actions`) solves an eval set.

It is where "learned nothing" sits. A start (an SFT checkpoint, a base model) whose greedy solve rate is
at chance does not read the observations yet, whatever its loss says; GRPO from it samples episodes no
better than random ones. Each task is played `samples` times, the episodes at once (in batches of
what one CreateEpisodes call creates), over the env service's gRPC API (no model, no rollout
service). An episode counts as solved as the run's evals count it: `info["solved"]` where the env
reports it, a positive return otherwise."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from google.protobuf.json_format import MessageToDict

from mmrl.envcheck.probe import EnvProbe
from mmrl_proto.v1 import env_pb2
from services.common.task import episode_solved

MAX_TURNS = 1000  # a guard against an env whose episodes never end; the eval sets' move budgets end them first


@dataclass(frozen=True)
class ChanceResult:
    """The uniform random policy on one eval set."""

    env: str
    eval_set: str
    tasks: int
    samples: int
    actions: tuple[str, ...]
    solve_rate: float   # share of all episodes solved
    pass_rate: float    # share of tasks solved by at least one of their episodes
    mean_turns: float

    def as_dict(self) -> dict[str, Any]:
        return {"env": self.env, "eval_set": self.eval_set, "tasks": self.tasks, "samples": self.samples,
                "actions": list(self.actions), "chance_solve_rate": self.solve_rate,
                "chance_pass_rate": self.pass_rate, "mean_turns": self.mean_turns}


def _solved(state: env_pb2.EpisodeState, total_reward: float) -> bool:
    return episode_solved(MessageToDict(state.info), total_reward)


async def _play(probe: EnvProbe, specs: list[env_pb2.EpisodeSpec], actions: tuple[str, ...],
                rng: random.Random) -> tuple[list[bool], int]:
    """Plays one episode of each spec at once with random actions; (solved per episode, turns played)."""
    states = await probe.create(specs)
    index = {s.episode_id: i for i, s in enumerate(states)}
    returns = [0.0] * len(states)
    solved = [s.done and _solved(s, 0.0) for s in states]
    running = [s for s in states if not s.done]
    turns = 0
    for _ in range(MAX_TURNS):  # past the guard, the episodes still running count as unsolved
        if not running:
            break
        stepped = await probe.step([(s.episode_id, rng.choice(actions)) for s in running])
        turns += len(stepped)
        running = []
        for s in stepped:
            i = index[s.episode_id]
            returns[i] += s.reward
            if s.done:
                solved[i] = _solved(s, returns[i])
            else:
                running.append(s)
    await probe.close(list(index))
    return solved, turns


async def chance_rate(address: str, eval_set: str = "", samples: int = 16, seed: int = 0,
                      timeout_s: float = 60.0, max_batch: int = 4096) -> ChanceResult:
    """Plays the eval set `eval_set` ("" = the env's default) `samples` times per task with uniformly
    random actions drawn from `random.Random(seed)`, at most `max_batch` episodes at once (the env
    service's limit of one CreateEpisodes call); ValueError when the env lists no actions."""
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    probe = EnvProbe(address, timeout_s)
    try:
        info = await probe.info()
        actions = tuple(info.actions)
        if not actions:
            raise ValueError(f"env {info.name!r} lists no action words (GetEnvInfo.actions): no uniform choice")
        reply = await probe.eval_set(eval_set)
        specs = list(reply.specs)
        rng = random.Random(seed)
        wanted = [task for task in range(len(specs)) for _ in range(samples)]
        solved: list[tuple[int, bool]] = []  # (task, solved) per episode
        turns = 0
        for first in range(0, len(wanted), max_batch):
            chunk = wanted[first:first + max_batch]
            played, chunk_turns = await _play(probe, [specs[task] for task in chunk], actions, rng)
            solved += zip(chunk, played, strict=True)
            turns += chunk_turns
        per_task = [False] * len(specs)
        for task, won in solved:
            per_task[task] |= won
        return ChanceResult(
            env=info.name, eval_set=reply.name or eval_set, tasks=len(specs), samples=samples, actions=actions,
            solve_rate=sum(won for _, won in solved) / len(solved) if solved else 0.0,
            pass_rate=sum(per_task) / len(specs) if specs else 0.0,
            mean_turns=turns / len(solved) if solved else 0.0)
    finally:
        await probe.close_all()
        await probe.channel.close()
