"""gRPC clients of the env, rollout and learner services, as the coordinator uses them.

Every call has a deadline and bounded retries (UNAVAILABLE only, with backoff); a failure raises
ServiceError naming the service and its address, so a run fails with a reason a user can act on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from mmrl.v1 import env_pb2_grpc, learner_pb2, learner_pb2_grpc, rollout_pb2, rollout_pb2_grpc
from services.common.grpc_server import channel, check_health
from services.common.waiting import poll_until

log = logging.getLogger("mmrl.coordinator.clients")
T = TypeVar("T")

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE}


class ServiceError(Exception):
    """A gRPC call to `service` at `address` failed (after retries)."""

    def __init__(self, service: str, address: str, method: str, code: str, details: str) -> None:
        super().__init__(f"{service} service at {address}: {method} failed with {code}: {details}")
        self.service = service
        self.address = address
        self.code = code


@dataclass
class CallPolicy:
    timeout_s: float = 600.0
    retries: int = 3
    backoff_s: float = 0.5


class _Client:
    service = "service"

    def __init__(self, address: str, policy: CallPolicy) -> None:
        self.address = address
        self.policy = policy
        self.channel = channel(address)

    async def call(self, method: str, rpc: Callable[..., Awaitable[T]], request: Any,
                   timeout_s: float | None = None) -> T:
        attempt = 0
        while True:
            try:
                return await rpc(request, timeout=timeout_s or self.policy.timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _RETRYABLE and attempt < self.policy.retries:
                    attempt += 1
                    log.warning("retrying", extra={"service": self.service, "method": method,
                                                   "attempt": attempt, "code": exc.code().name})
                    await asyncio.sleep(self.policy.backoff_s * 2 ** (attempt - 1))
                    continue
                raise ServiceError(self.service, self.address, method, exc.code().name,
                                   exc.details() or "") from exc

    async def healthy(self) -> bool:
        return await check_health(self.address)

    async def close(self) -> None:
        await self.channel.close()


class EnvClient(_Client):
    service = "env"

    def __init__(self, address: str, policy: CallPolicy) -> None:
        super().__init__(address, policy)
        self.stub = env_pb2_grpc.EnvServiceStub(self.channel)


class RolloutClient(_Client):
    service = "rollout"

    def __init__(self, address: str, policy: CallPolicy) -> None:
        super().__init__(address, policy)
        self.stub = rollout_pb2_grpc.RolloutServiceStub(self.channel)

    async def load_adapter(self, run_id: str, version: int, path: str,
                           manifest_sha256: str = "") -> rollout_pb2.LoadAdapterResponse:
        """Loads the adapter version and checks what the replica confirms: the version, and the
        manifest checksum the learner published when one is given."""
        reply = await self.call("LoadAdapter", self.stub.LoadAdapter,
                                rollout_pb2.LoadAdapterRequest(run_id=run_id, version=version, path=path))
        if reply.version != version:
            raise ServiceError(self.service, self.address, "LoadAdapter", "MISMATCH",
                               f"asked for version {version}, replica confirmed {reply.version}")
        if manifest_sha256 and reply.manifest_sha256 != manifest_sha256:
            raise ServiceError(self.service, self.address, "LoadAdapter", "MISMATCH",
                               f"version {version} was published with manifest sha256 {manifest_sha256}, "
                               f"the replica loaded {reply.manifest_sha256}")
        return reply


class LearnerClient(_Client):
    service = "learner"

    def __init__(self, address: str, policy: CallPolicy) -> None:
        super().__init__(address, policy)
        self.stub = learner_pb2_grpc.LearnerServiceStub(self.channel)

    async def state(self, run_id: str) -> learner_pb2.LearnerState:
        return await self.call("GetState", self.stub.GetState, learner_pb2.GetStateRequest(run_id=run_id))


@dataclass
class Services:
    """The clients one run talks to."""

    env: EnvClient
    rollouts: list[RolloutClient]
    learner: LearnerClient

    @classmethod
    def connect(cls, env: str, rollouts: list[str], learner: str, policy: CallPolicy) -> Services:
        if not rollouts:
            raise ValueError("at least one rollout replica address is needed")
        return cls(EnvClient(env, policy), [RolloutClient(a, policy) for a in rollouts],
                   LearnerClient(learner, policy))

    def all(self) -> list[_Client]:
        return [self.env, *self.rollouts, self.learner]

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

    async def wait_healthy(self, timeout_s: float, poll_s: float = 2.0) -> None:
        """Waits until every service is SERVING; raises require_healthy's ServiceError after `timeout_s`."""

        async def all_healthy() -> bool:
            return await self.first_unhealthy() is None

        if not await poll_until(all_healthy, timeout_s, poll_s):
            await self.require_healthy()

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.all()))
