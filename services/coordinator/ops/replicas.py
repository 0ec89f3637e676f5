"""The replicas of a run as one: env replicas (an episode stays on the replica that created it),
rollout replicas (an episode stays on the replica of its first turn, whose prefix cache holds its
conversation; adapter loads, sleeps and wake-ups go to every replica at once) and the learner."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from services.common.waiting import poll_until
from services.coordinator.ops.clients import (
    CallPolicy,
    EnvClient,
    LearnerClient,
    RolloutClient,
    ServiceError,
    _Client,
)
from services.coordinator.ops.wire import (
    EnvInfo,
    EpisodeState,
    EvalSet,
    Generation,
    ModelInfo,
    Prompt,
    TaskSpec,
)

R = TypeVar("R")
I = TypeVar("I")


async def by_replica(items: Sequence[I], replicas: Sequence[int],
                     call: Callable[[int, list[I]], Awaitable[list[R]]]) -> list[R]:
    """Sends each replica its items (`replicas[i]` is item i's) in one call, all replicas at once;
    the answers in the items' order."""
    shares: dict[int, list[int]] = {}
    for index, replica in enumerate(replicas):
        shares.setdefault(replica, []).append(index)
    replies = await asyncio.gather(*(call(replica, [items[i] for i in indices]) for replica, indices in shares.items()))
    results: list[Any] = [None] * len(items)
    for indices, answers in zip(shares.values(), replies, strict=True):
        assert len(answers) == len(indices), "a replica answered another number of items than it was sent"
        for index, answer in zip(indices, answers, strict=True):
            results[index] = answer
    return results


class Envs:
    """The env replicas of a run, as one. Task draws, eval sets and the env's description come from
    the first; new episodes are spread round-robin over all of them, and every later call about an
    episode goes to the replica that created it (only it holds the episode)."""

    def __init__(self, clients: Sequence[EnvClient]) -> None:
        self.clients = list(clients)
        self._home: dict[str, int] = {}  # episode id -> replica index
        self._next = 0

    async def info(self) -> EnvInfo:
        return await self.clients[0].info()

    async def training_tasks(self, seed: str, count: int, max_moves: int,
                             options: Mapping[str, str]) -> list[TaskSpec]:
        return await self.clients[0].training_tasks(seed, count, max_moves, options)

    async def eval_set(self, name: str = "") -> EvalSet:
        return await self.clients[0].eval_set(name)

    async def create_episodes(self, specs: Sequence[TaskSpec]) -> list[EpisodeState]:
        replicas = [(self._next + i) % len(self.clients) for i in range(len(specs))]
        self._next += len(specs)
        states = await by_replica(specs, replicas, lambda r, share: self.clients[r].create_episodes(share))
        for state, replica in zip(states, replicas, strict=True):
            self._home[state.episode_id] = replica
        return states

    def _replica_of(self, episode_id: str) -> int:
        return self._home.get(episode_id, 0)  # an id no replica created: the first says NOT_FOUND

    async def step(self, actions: Sequence[tuple[str, str]]) -> list[EpisodeState]:
        return await by_replica(actions, [self._replica_of(a[0]) for a in actions],
                                lambda r, share: self.clients[r].step(share))

    async def close_episodes(self, episode_ids: Sequence[str]) -> None:
        async def close(replica: int, share: list[str]) -> list[None]:
            await self.clients[replica].close_episodes(share)
            return [None] * len(share)

        await by_replica(episode_ids, [self._replica_of(e) for e in episode_ids], close)
        for episode_id in episode_ids:
            self._home.pop(episode_id, None)


class Rollouts:
    """The rollout replicas of a run, as one: a batch is split across them, and an episode (named
    by its key) stays on the replica that served its first turn, so that replica's prefix cache
    holds its conversation turn after turn. Adapter loads, sleeps and wake-ups go to every replica
    at once; each must confirm."""

    def __init__(self, clients: Sequence[RolloutClient]) -> None:
        self.clients = list(clients)
        self._home: dict[str, int] = {}  # episode key -> replica index
        self._next = 0

    def __len__(self) -> int:
        return len(self.clients)

    def replica_of(self, key: str) -> int:
        """The replica an episode is served by: assigned round-robin at its first turn."""
        if key not in self._home:
            self._home[key] = self._next % len(self.clients)
            self._next += 1
        return self._home[key]

    def forget(self, keys: Iterable[str]) -> None:
        """Episodes that are over no longer hold a replica."""
        for key in keys:
            self._home.pop(key, None)

    async def generate(self, prompts: Sequence[Prompt], keys: Sequence[str]) -> list[Generation]:
        """One completion per prompt, in order; each replica gets its episodes' prompts in one call,
        all replicas at once."""
        assert len(prompts) == len(keys)
        return await by_replica(prompts, [self.replica_of(key) for key in keys],
                                lambda r, share: self.clients[r].generate(share))

    async def load_adapter(self, run_id: str, version: int, path: str, manifest_sha256: str = "") -> None:
        await asyncio.gather(*(c.load_adapter(run_id, version, path, manifest_sha256) for c in self.clients))

    async def served_versions(self, run_id: str) -> set[int]:
        """The run's adapter versions any replica holds."""
        return set().union(*await asyncio.gather(*(c.served_versions(run_id) for c in self.clients)))

    async def release_adapters(self, run_id: str) -> None:
        await asyncio.gather(*(c.release_adapters(run_id) for c in self.clients))

    async def require_room(self, runs: int) -> None:
        """ServiceError naming the first replica that keeps the adapters of fewer than `runs` runs at once
        (each learner pool's run samples there with its own adapter): the runs would unload each other's."""
        if runs <= 1:
            return
        infos = await asyncio.gather(*(c.model_info() for c in self.clients))
        for client, info in zip(self.clients, infos, strict=True):
            if 0 < info.max_adapter_runs < runs:
                raise ServiceError(client.service, client.address, "GetModelInfo", "FAILED_PRECONDITION",
                                   f"the replica keeps the adapters of {info.max_adapter_runs} runs at once but "
                                   f"{runs} learner pools share it (MMRL_LEARNER_ADDRS): start it with "
                                   f"--max-adapter-runs {runs} (and --max-loras {runs})")

    async def sleep(self, level: int = 1) -> None:
        await asyncio.gather(*(c.sleep(level) for c in self.clients))

    async def wake_up(self) -> None:
        await asyncio.gather(*(c.wake_up() for c in self.clients))

    async def model_info(self) -> ModelInfo:
        return await self.clients[0].model_info()


@dataclass
class Services:
    """The clients one run talks to."""

    env: Envs
    rollouts: Rollouts
    learner: LearnerClient

    @classmethod
    def connect(cls, envs: list[str], rollouts: list[str], learner: str, policy: CallPolicy) -> Services:
        if not envs or not rollouts:
            raise ValueError("at least one env and one rollout replica address are needed")
        return cls(Envs([EnvClient(a, policy) for a in envs]), Rollouts([RolloutClient(a, policy) for a in rollouts]),
                   LearnerClient(learner, policy))

    def all(self) -> list[_Client]:
        return [*self.env.clients, *self.rollouts.clients, self.learner]

    async def first_unhealthy(self) -> _Client | None:
        """The first service that is not SERVING (all are checked at once), or None."""
        clients = self.all()
        results = await asyncio.gather(*(c.healthy() for c in clients))
        return next((client for client, ok in zip(clients, results, strict=True) if not ok), None)

    async def require_healthy(self) -> None:
        """Raises ServiceError naming the first service that is not SERVING."""
        client = await self.first_unhealthy()
        if client is not None:
            raise ServiceError(client.service, client.address, "Health.Check", "NOT_SERVING",
                               "the service is down or not ready")

    async def wait_healthy(self, timeout_s: float, poll_s: float = 1.0, max_poll_s: float = 15.0) -> None:
        """Waits until every service is SERVING, polling with backoff (from `poll_s` up to
        `max_poll_s`); raises require_healthy's ServiceError after `timeout_s`."""

        async def all_healthy() -> bool:
            return await self.first_unhealthy() is None

        if not await poll_until(all_healthy, timeout_s, poll_s, max_poll_s):
            await self.require_healthy()

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.all()))
