"""What the coordinator's clients check in a replica's replies."""

from __future__ import annotations

from typing import Any

import pytest

from mmrl_proto.v1 import rollout_pb2
from services.coordinator.ops.clients import CallPolicy, RolloutClient, ServiceError


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
