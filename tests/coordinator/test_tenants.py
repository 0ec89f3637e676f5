"""Tenants on a real Redis: API tokens map to tenants and roles; a member sees and controls only its
tenant's runs (every route that names a run answers 404 for another tenant's, frames and events
included), an admin every run; per-tenant limits; triggers carry their rule's tenant."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from fastapi.testclient import TestClient

from services.common.procs import free_port
from services.coordinator.api.app import create_app
from services.coordinator.config import CoordinatorSettings
from tests.coordinator.finished_run import record_with_env_server
from tests.coordinator.triggers_support import eventbridge, put_object, trigger_settings, wait_for

DB = 6
ALICE, BOB, ROOT_TOKEN, LEGACY = "alice-token-aaaa", "bob-token-bbbbbb", "admin-token-cccc", "legacy-admin-tok"
TOKENS = {"tokens": [{"token": ALICE, "tenant": "vision", "role": "member"},
                     {"token": BOB, "tenant": "robotics", "role": "member"},
                     {"token": ROOT_TOKEN, "tenant": "platform", "role": "admin"}],
          "tenants": {"vision": {"max_queued": 1}, "robotics": {"max_running": 1}}}


@pytest.fixture(scope="module")
def recorded(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A finished run with episodes and frames, of the tenant vision."""
    shared_root = tmp_path_factory.mktemp("shared")
    url = f"{redis_url}/{DB}"
    redis.Redis.from_url(url).flushdb()
    asyncio.run(record_with_env_server(url, shared_root, run_id="vision-run"))
    redis.Redis.from_url(url).hset("mmrl:run:vision-run", "tenant", "vision")
    return url, shared_root


def _settings(url: str, shared_root: Path, tokens_file: Path, pools: int = 1) -> CoordinatorSettings:
    dead = [f"127.0.0.1:{free_port()}" for _ in range(2 + pools)]
    return CoordinatorSettings(redis_url=url, api_token=LEGACY, api_tokens_file=tokens_file, shared_root=shared_root,
                               env_addr=dead[0], rollout_addrs=dead[1], learner_addrs=",".join(dead[2:]),
                               rpc_timeout_s=5, rpc_retries=0, resume_runs=False, allowed_models="some/model")


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump(TOKENS))
    return path


@pytest.fixture
def client(recorded: tuple[str, Path], tokens_file: Path) -> Iterator[TestClient]:
    with TestClient(create_app(_settings(*recorded, tokens_file))) as test_client:
        yield test_client


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _run_routes(client: TestClient) -> list[tuple[str, str]]:
    """(method, path) of every route that names a run."""
    return sorted((method, route.path) for route in client.app.routes  # type: ignore[attr-defined]
                  if "{run_id}" in getattr(route, "path", "") for method in getattr(route, "methods", ()))


def test_a_member_cannot_read_list_or_control_another_tenants_run_on_any_route(client: TestClient) -> None:
    episode = client.get("/v1/runs/vision-run/episodes", params={"kind": "eval"}, headers=_as(ALICE)).json()
    episode_id = episode["episodes"][0]["id"]
    values = {"{run_id}": "vision-run", "{episode_id}": episode_id, "{index}": "0", "{action}": "stop"}
    routes = _run_routes(client)
    assert len(routes) >= 10, routes
    for method, template in routes:
        path = template
        for name, value in values.items():
            path = path.replace(name, value)
        body = {"json": {"priority": 1}} if method == "PATCH" else {}
        foreign = client.request(method, path, headers=_as(BOB), params={"follow": False}, **body)
        unknown = client.request(method, path.replace("vision-run", "no-such-run"), headers=_as(BOB),
                                 params={"follow": False}, **body)
        assert foreign.status_code == 404, (method, path, foreign.text)
        assert foreign.json()["detail"] == unknown.json()["detail"].replace("no-such-run", "vision-run")
        if method == "GET":  # the owner and an admin read it
            for token in (ALICE, ROOT_TOKEN, LEGACY):
                assert client.get(path, headers=_as(token), params={"follow": False}).status_code == 200, path
    assert client.get("/v1/runs/vision-run", headers=_as(ALICE)).json()["state"] == "succeeded"  # BOB's stop: 404

    def listed(token: str, **params: str) -> list[str]:
        return [r["id"] for r in client.get("/v1/runs", headers=_as(token), params=params).json()["runs"]]

    assert listed(BOB) == [] and listed(BOB, tenant="vision") == [] and listed(BOB, state="succeeded") == []
    assert listed(ALICE) == ["vision-run"] == listed(ROOT_TOKEN, tenant="vision")
    assert listed(ROOT_TOKEN) == ["vision-run"] == listed(LEGACY)
    assert client.get("/v1/runs", headers=_as(BOB)).json()["total"] == 0
    assert client.get("/v1/runs", headers=_as("not-a-token-at-all")).status_code == 401


def test_runs_record_the_tenant_of_the_token_that_created_them(client: TestClient) -> None:
    created = {token: client.post("/v1/runs", headers=_as(token),
                                  json={"config": {"name": "t", "model": "some/model", "steps": 1}}).json()
               for token in (BOB, ROOT_TOKEN, LEGACY)}
    assert {t: run["tenant"] for t, run in created.items()} == {BOB: "robotics", ROOT_TOKEN: "platform",
                                                                LEGACY: "default"}
    assert client.get(f"/v1/runs/{created[ROOT_TOKEN]['id']}", headers=_as(BOB)).status_code == 404
    assert client.get(f"/v1/runs/{created[BOB]['id']}", headers=_as(ROOT_TOKEN)).status_code == 200
    for run in created.values():
        client.post(f"/v1/runs/{run['id']}/stop", headers=_as(ROOT_TOKEN))


def test_a_tenant_at_max_queued_is_refused_with_429_naming_the_limit_and_others_are_not(
        redis_url: str, tmp_path: Path, tokens_file: Path, tiny_model_dir: Path, held_runs: threading.Event) -> None:
    url = f"{redis_url}/{DB + 1}"
    redis.Redis.from_url(url).flushdb()
    settings = _settings(url, tmp_path, tokens_file).model_copy(update={"allowed_models": str(tiny_model_dir)})
    config = {"name": "limited", "model": str(tiny_model_dir), "steps": 1}
    with TestClient(create_app(settings)) as client:
        client.headers.update(_as(ROOT_TOKEN))
        first = client.post("/v1/runs", headers=_as(ALICE), json={"config": config}).json()
        wait_for(client, f"/v1/runs/{first['id']}", lambda r: r["state"] == "running")
        queued = client.post("/v1/runs", headers=_as(ALICE), json={"config": config})
        assert queued.status_code == 201 and queued.json()["queue_position"] == 1
        refused = client.post("/v1/runs", headers=_as(ALICE), json={"config": config})
        assert refused.status_code == 429
        assert refused.json()["detail"].startswith("tenant 'vision' is at its limit of queued runs (max_queued 1")
        assert client.post("/v1/runs", headers=_as(BOB), json={"config": config}).status_code == 201
        assert client.get("/v1/runs", headers=_as(ALICE)).json()["total"] == 2  # nothing recorded
        held_runs.set()


def test_a_tenant_at_max_running_waits_while_a_pool_stays_free_for_others(
        redis_url: str, tmp_path: Path, tokens_file: Path, tiny_model_dir: Path, held_runs: threading.Event) -> None:
    url = f"{redis_url}/{DB + 1}"
    redis.Redis.from_url(url).flushdb()
    settings = _settings(url, tmp_path, tokens_file, pools=2).model_copy(update={"allowed_models": str(tiny_model_dir)})
    config = {"name": "robot", "model": str(tiny_model_dir), "steps": 1}
    with TestClient(create_app(settings)) as client:
        client.headers.update(_as(ROOT_TOKEN))
        runs = [client.post("/v1/runs", headers=_as(BOB), json={"config": config}).json() for _ in range(2)]
        wait_for(client, f"/v1/runs/{runs[0]['id']}", lambda r: r["state"] == "running")
        assert client.get(f"/v1/runs/{runs[1]['id']}", headers=_as(BOB)).json()["state"] == "queued"
        other = client.post("/v1/runs", headers=_as(ALICE), json={"config": config}).json()
        assert other["state"] in ("pending", "running")  # the second pool, free all along
        held_runs.set()
        wait_for(client, f"/v1/runs/{runs[1]['id']}", lambda r: r["state"] == "succeeded")


def test_a_triggered_run_carries_its_rules_tenant_and_a_member_posts_only_its_own_rules(
        redis_url: str, tmp_path: Path, tokens_file: Path) -> None:
    url = f"{redis_url}/{DB + 1}"
    redis.Redis.from_url(url).flushdb()
    rules = [{"name": "vision-configs", "pattern": "vision/*.yaml", "action": "config", "tenant": "vision"}]
    app = create_app(_settings(url, tmp_path, tokens_file), trigger_settings=trigger_settings(rules, tmp_path))
    config = {"name": "triggered", "model": "some/model", "steps": 1}
    put_object(tmp_path / "buckets", "vision/a.yaml", config)
    put_object(tmp_path / "buckets", "vision/b.yaml", config)
    with TestClient(app) as client:
        foreign = client.post("/v1/triggers/s3", headers=_as(BOB), json=eventbridge("vision/a.yaml", "e1"))
        assert foreign.status_code == 422 and "no trigger rule matches" in foreign.json()["detail"]
        for token, key in ((ALICE, "vision/a.yaml"), (ROOT_TOKEN, "vision/b.yaml")):
            reply = client.post("/v1/triggers/s3", headers=_as(token), json=eventbridge(key, key))
            assert reply.status_code == 201, reply.text
            run = client.get(f"/v1/runs/{reply.json()['outcomes'][0]['run_id']}", headers=_as(ALICE)).json()
            assert (run["tenant"], run["trigger"]["rule"]) == ("vision", "vision-configs")
        events: Any = {t: client.get("/v1/triggers/events", headers=_as(t)).json()["events"] for t in (ALICE, BOB)}
        assert [e["outcome"] for e in events[ALICE]] == ["started", "started"]
        assert events[BOB] == []  # its own rejected event matched no rule, so no tenant's


def test_a_tokens_file_that_does_not_validate_stops_the_coordinator_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "tokens.yaml"
    for content, words in (({"tokens": [{"token": "x", "tenant": "Bad Name"}]}, "tenant"),
                           ({"tokens": [{"token": "x", "tenant": "a"}, {"token": "x", "tenant": "b"}]}, "twice"),
                           ({"tokens": [], "tenants": {"a": {"max_queued": -1}}}, "max_queued"),
                           ({"tokens": [{"token": LEGACY, "tenant": "a"}]}, "list each token once")):
        bad.write_text(yaml.safe_dump(content))
        with pytest.raises(ValueError, match=words):
            create_app(CoordinatorSettings(api_token=LEGACY, api_tokens_file=bad, shared_root=tmp_path))
