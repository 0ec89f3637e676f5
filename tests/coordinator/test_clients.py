"""What the coordinator's clients check in replicas' replies."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mmrl_proto.v1 import rollout_pb2
from services.coordinator.ops.clients import CallPolicy, RolloutClient, ServiceError
from services.coordinator.ops.replicas import Rollouts


async def test_a_replica_that_loaded_other_adapter_bytes_than_were_published_is_a_mismatch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    client = RolloutClient("127.0.0.1:1", CallPolicy(timeout_s=1, retries=0))
    replies = iter([rollout_pb2.LoadAdapterResponse(run_id="r", version=3, manifest_sha256="aa"),
                    rollout_pb2.LoadAdapterResponse(run_id="r", version=3, manifest_sha256="bb"),
                    rollout_pb2.LoadAdapterResponse(run_id="r", version=2, manifest_sha256="aa")])

    async def call(_method: str, _rpc: Any, _request: Any) -> rollout_pb2.LoadAdapterResponse:
        return next(replies)

    monkeypatch.setattr(client, "call", call)
    try:
        await client.load_adapter("r", 3, "runs/r/adapters/v000003", "aa")  # as published: no error
        with pytest.raises(ServiceError, match="published with manifest sha256 aa, the replica loaded bb"):
            await client.load_adapter("r", 3, "runs/r/adapters/v000003", "aa")
        with pytest.raises(ServiceError, match="asked for version 3, replica confirmed 2"):
            await client.load_adapter("r", 3, "runs/r/adapters/v000003", "aa")
    finally:
        await client.close()


async def test_replicas_that_keep_fewer_runs_adapters_than_there_are_learner_pools_are_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clients = [RolloutClient(f"127.0.0.1:{port}", CallPolicy(timeout_s=1, retries=0)) for port in (1, 2)]
    room = {clients[0].address: 3, clients[1].address: 2}
    for client in clients:
        async def call(_method: str, _rpc: Any, _request: Any, client: RolloutClient = client) -> Any:
            return rollout_pb2.GetModelInfoResponse(model="m", max_adapter_runs=room[client.address])

        monkeypatch.setattr(client, "call", call)
    rollouts = Rollouts(clients)
    try:
        await rollouts.require_room(2)
        with pytest.raises(ServiceError, match=r"127.0.0.1:2: .*keeps the adapters of 2 runs at once but 3 learner "
                                               r"pools share it .*--max-adapter-runs 3"):
            await rollouts.require_room(3)
    finally:
        await asyncio.gather(*(client.close() for client in clients))
