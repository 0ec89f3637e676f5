"""Bad input and abuse against the REST API on a real Redis: non-finite numbers, oversized bodies,
auth before the body, pagination, endpoints and models outside the deployment, declared errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from services.common.procs import free_port
from services.coordinator.api.app import create_app
from services.coordinator.config import CoordinatorSettings

TOKEN = "bad-input-token"
LEARNERS = [f"127.0.0.1:{free_port()}" for _ in range(5)]  # one per listed run (a learner takes one run)


@pytest.fixture
def settings(redis_url: str, tmp_path: Path) -> CoordinatorSettings:
    redis.Redis.from_url(f"{redis_url}/4").flushdb()
    dead = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    return CoordinatorSettings(redis_url=f"{redis_url}/4", api_token=TOKEN, shared_root=tmp_path / "shared",
                               env_addr=dead[0], rollout_addrs=dead[1], learner_addrs=dead[2], rpc_timeout_s=5,
                               rpc_retries=0, resume_runs=False, max_request_bytes=64 * 1024,
                               allowed_models="org/allowed-model", allowed_endpoints=",".join(LEARNERS))


@pytest.fixture
def client(settings: CoordinatorSettings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        test_client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield test_client


def _body(**overrides: object) -> dict[str, object]:
    return {"config": {"name": "bad", "model": "org/allowed-model", "steps": 2, **overrides}}


def _raw_post(client: TestClient, text: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return client.post("/v1/runs", content=text.encode(),
                       headers={"Content-Type": "application/json", **(headers or {})})


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_number_is_a_422_naming_the_field(client: TestClient, literal: str) -> None:
    for section, field in (("loss", "tis_cap"), ("sampling", "temperature"), ("optim", "lr")):
        text = '{"config": {"name": "x", "model": "org/allowed-model", "SECTION": {"FIELD": VALUE}}}'
        text = text.replace("SECTION", section).replace("FIELD", field).replace("VALUE", literal)
        reply = _raw_post(client, text)
        assert reply.status_code == 422, (section, reply.text)
        locations = [".".join(map(str, e["loc"])) for e in reply.json()["detail"]]
        assert f"body.config.{section}.{field}" in locations
    assert client.get("/v1/runs").json()["total"] == 0  # nothing stored


def test_a_body_over_the_limit_is_a_413_and_is_not_stored(client: TestClient) -> None:
    reply = client.post("/v1/runs", json=_body(system_prompt="x" * 100_000))
    assert reply.status_code == 413 and "MMRL_MAX_REQUEST_BYTES" in reply.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while read
        yield b'{"config": {"name": "x", "model": "org/allowed-model", "system_prompt": "'
        for _ in range(100):
            yield b"y" * 1024
        yield b'"}}'

    assert client.post("/v1/runs", content=chunks(), headers={"Content-Type": "application/json"}).status_code == 413
    assert client.get("/v1/runs").json()["total"] == 0


def test_a_request_without_the_token_is_refused_before_its_body_is_read(client: TestClient) -> None:
    read: list[int] = []

    def chunks() -> Iterator[bytes]:
        for _ in range(4):
            read.append(1)
            yield b"x" * 1024

    reply = client.post("/v1/runs", content=chunks(), headers={"Authorization": "Bearer wrong",
                                                               "Content-Type": "application/json"})
    assert reply.status_code == 401
    too_big = client.post("/v1/runs", content=b"x" * 200_000, headers={"Authorization": ""})
    assert too_big.status_code == 401  # auth first, then size


def test_endpoints_and_models_outside_the_deployment_are_refused(client: TestClient,
                                                                 settings: CoordinatorSettings) -> None:
    cases = [(_body(endpoints={"env": ["169.254.169.254:80"]}), "endpoints.env"),
             (_body(endpoints={"rollout": [settings.rollout_addrs, "evil.example:443"]}), "endpoints.rollout[1]"),
             (_body(endpoints={"learner": "10.0.0.9:50053"}), "endpoints.learner"),
             (_body(model="someone/else"), "model"),
             (_body(model="/etc"), "model"),
             (_body(model=str(settings.shared_root / ".." / "outside")), "model")]
    for body, field in cases:
        reply = client.post("/v1/runs", json=body)
        assert reply.status_code == 422, (field, reply.text)
        assert field in reply.json()["detail"][0]["msg"]
    assert client.get("/v1/runs").json()["total"] == 0
    configured = _body(endpoints={"learner": settings.learner_addrs}, model=str(settings.shared_root / "models" / "m"))
    assert client.post("/v1/runs", json=configured).status_code == 201


def test_runs_are_listed_a_page_at_a_time_without_their_configs(client: TestClient) -> None:
    ids = []
    for i in range(5):
        run = client.post("/v1/runs", json=_body(name=f"r{i}", endpoints={"learner": LEARNERS[i]}, steps=1)).json()
        ids.append(run["id"])
    page = client.get("/v1/runs", params={"offset": 1, "limit": 2}).json()
    assert page["total"] == 5 and [r["id"] for r in page["runs"]] == ids[1:3]
    assert "config" not in page["runs"][0]
    assert "config" in client.get(f"/v1/runs/{ids[0]}").json()
    assert client.get("/v1/runs", params={"limit": 5000}).status_code == 422


def test_the_openapi_declares_the_error_replies(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    create = paths["/v1/runs"]["post"]["responses"]
    assert {"401", "413", "422", "503"} <= set(create)
    control = paths["/v1/runs/{run_id}/{action}"]["post"]["responses"]
    assert {"401", "404", "409", "422"} <= set(control)
    assert {"401", "404"} <= set(paths["/v1/runs/{run_id}"]["get"]["responses"])


def test_an_unreachable_redis_is_a_503_with_retry_after(tmp_path: Path) -> None:
    settings = CoordinatorSettings(redis_url=f"redis://127.0.0.1:{free_port()}/0", shared_root=tmp_path,
                                   resume_runs=False)
    with TestClient(create_app(settings)) as client:
        reply = client.get("/v1/runs")
        assert reply.status_code == 503 and reply.headers["Retry-After"]
        assert client.post("/v1/runs", json=_body(model=str(tmp_path / "m"))).status_code == 503
