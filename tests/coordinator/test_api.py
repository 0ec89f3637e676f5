"""REST API against a real Redis: auth, bad input, state conflicts, failing services, events."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from services.common.procs import free_port
from services.coordinator.api.app import create_app
from services.coordinator.config import CoordinatorSettings

TOKEN = "s3cret-token"
OTHER_LEARNERS = [f"127.0.0.1:{free_port()}" for _ in range(2)]  # a run config may name these


def _settings(redis_url: str, tmp_path: Path, token: str = "") -> CoordinatorSettings:
    dead = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    return CoordinatorSettings(
        redis_url=f"{redis_url}/2", api_token=token, shared_root=tmp_path, env_addr=dead[0],
        rollout_addrs=dead[1], learner_addrs=dead[2], rpc_timeout_s=5, rpc_retries=0, resume_runs=False,
        allowed_models=f"some/model,{tmp_path.parent}", allowed_endpoints=",".join(OTHER_LEARNERS),
    )


@pytest.fixture
def client(redis_url: str, tmp_path: Path) -> Iterator[TestClient]:
    redis.Redis.from_url(f"{redis_url}/2").flushdb()
    with TestClient(create_app(_settings(redis_url, tmp_path, TOKEN))) as test_client:
        test_client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield test_client


def _config(model: str = "some/model", **overrides: object) -> dict[str, object]:
    return {"name": "api-test", "model": model, "steps": 2, **overrides}


def _wait_for_state(client: TestClient, run_id: str, states: set[str], timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = client.get(f"/v1/runs/{run_id}").json()
        if run["state"] in states:
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} never reached {states}: {run}")


def test_routes_need_the_bearer_token_when_one_is_configured(client: TestClient) -> None:
    assert client.get("/v1/runs").status_code == 200
    assert client.get("/v1/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/v1/runs", headers={"Authorization": ""}).status_code == 401
    assert client.get("/healthz", headers={"Authorization": ""}).status_code == 200


def test_an_invalid_run_config_is_a_422_listing_the_fields(client: TestClient) -> None:
    body = {"config": _config(env={"size": 8}, grpo={"group_size": 1}, bogus=True)}
    reply = client.post("/v1/runs", json=body)
    assert reply.status_code == 422
    locations = {".".join(str(p) for p in err["loc"]) for err in reply.json()["detail"]}
    assert "body.config.grpo.group_size" in locations
    assert "body.config.bogus" in locations
    assert any(loc.startswith("body.config.env") for loc in locations)
    assert client.post("/v1/runs", json={"config": {"name": "x"}}).status_code == 422  # model missing


def test_unknown_runs_and_episodes_are_404(client: TestClient) -> None:
    for path in ("/v1/runs/nope", "/v1/runs/nope/metrics", "/v1/runs/nope/evals", "/v1/runs/nope/episodes",
                 "/v1/runs/nope/events"):
        assert client.get(path).status_code == 404, path
    assert client.post("/v1/runs/nope/stop").status_code == 404


def test_a_run_whose_services_are_down_fails_naming_the_service(client: TestClient, tiny_model_dir: Path) -> None:
    created = client.post("/v1/runs", json={"config": _config(str(tiny_model_dir))})
    assert created.status_code == 201
    run = _wait_for_state(client, created.json()["id"], {"failed"})
    assert "env service at 127.0.0.1:" in run["failure_reason"]
    assert run["step"] == 0
    events = client.get(f"/v1/runs/{run['id']}/events").text
    assert "event: state" in events and '"failed"' in events
    first_id = events.split("id: ", 1)[1].split("\n", 1)[0]
    after_first = client.get(f"/v1/runs/{run['id']}/events", headers={"Last-Event-ID": first_id}).text
    assert f"id: {first_id}\n" not in after_first and after_first.count("id: ") == events.count("id: ") - 1
    # Redis refused it inside the stream: a 200 with an empty, broken stream.
    bad = client.get(f"/v1/runs/{run['id']}/events", headers={"Last-Event-ID": "garbage"})
    assert bad.status_code == 400 and "Last-Event-ID" in bad.json()["detail"]


def test_actions_that_do_not_fit_the_state_are_409(client: TestClient, redis_url: str, tiny_model_dir: Path) -> None:
    run_id = client.post("/v1/runs", json={"config": _config(str(tiny_model_dir))}).json()["id"]
    _wait_for_state(client, run_id, {"failed"})
    for action in ("stop", "pause"):
        reply = client.post(f"/v1/runs/{run_id}/{action}")
        assert reply.status_code == 409, action
        assert "failed" in reply.json()["detail"]
    assert client.post(f"/v1/runs/{run_id}/explode").status_code == 404


def test_a_failed_run_can_be_resumed_and_its_failure_stays_in_its_history(client: TestClient,
                                                                          tiny_model_dir: Path) -> None:
    run_id = client.post("/v1/runs", json={"config": _config(str(tiny_model_dir))}).json()["id"]
    first = _wait_for_state(client, run_id, {"failed"})
    resumed = client.post(f"/v1/runs/{run_id}/resume")
    assert resumed.status_code == 200 and resumed.json()["state"] in ("pending", "running", "failed")
    _wait_for_state(client, run_id, {"failed"})  # its services are still down
    events = client.get(f"/v1/runs/{run_id}/events", params={"follow": False}).text
    assert "event: resume" in events and first["failure_reason"][:40] in events
    assert events.count('"state": "failed"') == 2


def test_a_run_left_running_with_nothing_driving_it_can_be_paused_and_resumed(
        client: TestClient, redis_url: str, tiny_model_dir: Path) -> None:
    """Redis says running but no task drives the run (its task ended while Redis was down, or the
    coordinator does not resume runs): a pause used to answer 200 and do nothing, and a resume 409."""
    run_id = client.post("/v1/runs", json={"config": _config(str(tiny_model_dir))}).json()["id"]
    _wait_for_state(client, run_id, {"failed"})
    orphan = redis.Redis.from_url(f"{redis_url}/2")
    orphan.hset(f"mmrl:run:{run_id}", mapping={"state": "running", "failure_reason": ""})
    assert client.post(f"/v1/runs/{run_id}/pause").status_code == 200
    assert client.get(f"/v1/runs/{run_id}").json()["state"] == "paused"
    assert client.post(f"/v1/runs/{run_id}/resume").status_code == 200
    assert "env service" in _wait_for_state(client, run_id, {"failed"})["failure_reason"]  # driven again
    orphan.hset(f"mmrl:run:{run_id}", mapping={"state": "running", "desired": "pause", "failure_reason": ""})
    assert client.post(f"/v1/runs/{run_id}/resume").status_code == 200  # not just the pause withdrawn
    assert "env service" in _wait_for_state(client, run_id, {"failed"})["failure_reason"]


def test_runs_are_listed_and_readiness_and_prometheus_metrics_answer(client: TestClient) -> None:
    created = client.post("/v1/runs", json={"config": _config()}).json()
    listed = client.get("/v1/runs").json()["runs"]
    assert [r["id"] for r in listed] == [created["id"]]
    assert client.get("/readyz").json() == {"status": "ok", "checks": {"redis": True}}
    text = client.get("/metrics").text
    assert "mmrl_runs{" in text
    assert client.get("/openapi.json").json()["info"]["title"] == "MMRL coordinator"


def test_readiness_fails_without_redis(tmp_path: Path) -> None:
    settings = _settings(f"redis://127.0.0.1:{free_port()}", tmp_path)
    with TestClient(create_app(settings)) as test_client:
        reply = test_client.get("/readyz")
    assert reply.status_code == 503
    assert reply.json()["checks"] == {"redis": False}


def test_runs_left_running_on_one_learner_resume_newest_first_and_the_others_wait_in_the_queue(
    redis_url: str, tmp_path: Path, tiny_model_dir: Path, held_runs: threading.Event
) -> None:
    from services.coordinator.ops.store import RunState, RunStore

    async def leave_running() -> list[str]:
        store = RunStore.from_url(f"{redis_url}/2")
        await store.r.flushdb()
        ids = []
        for name in ("older", "newer"):
            run = await store.create_run(f"{name}-run", name, _config(str(tiny_model_dir)), 2)
            await store.set_state(run["id"], RunState.RUNNING)
            ids.append(run["id"])
            await asyncio.sleep(0.01)  # distinct creation times
        await store.close()
        return ids

    older, newer = asyncio.run(leave_running())
    settings = _settings(redis_url, tmp_path).model_copy(update={"resume_runs": True})
    with TestClient(create_app(settings)) as resumed:
        _wait_for_state(resumed, newer, {"running"})
        run = _wait_for_state(resumed, older, {"queued"})
        assert run["failure_reason"] == f"re-queued: the learner at {settings.learner_addrs} is busy with run {newer!r}"
        assert run["queue_position"] == 1
        held_runs.set()
        _wait_for_state(resumed, newer, {"succeeded"})
        _wait_for_state(resumed, older, {"succeeded"})


def test_a_run_resumed_by_a_restarted_coordinator_waits_for_its_services(
    redis_url: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    from services.coordinator.ops.store import RunStore

    async def leave_running() -> str:
        store = RunStore.from_url(f"{redis_url}/2")
        await store.r.flushdb()
        run = await store.create_run("left-run", "left", _config(str(tiny_model_dir)), 2)
        await store.update_run(run["id"], state="running", checkpoint_step=0)  # it had started
        await store.close()
        return str(run["id"])

    run_id = asyncio.run(leave_running())
    settings = _settings(redis_url, tmp_path).model_copy(update={"resume_runs": True, "service_wait_s": 2.0})
    started = time.monotonic()
    with TestClient(create_app(settings)) as resumed:
        run = _wait_for_state(resumed, run_id, {"failed"})
    assert time.monotonic() - started >= 2.0  # a new run fails at once (test above); this one waited
    assert "env service at 127.0.0.1:" in run["failure_reason"]


def test_runs_left_running_resume_when_redis_comes_up_after_the_coordinator(
    tmp_path: Path, tiny_model_dir: Path, held_runs: threading.Event
) -> None:
    from services.common.procs import start_redis, stop_process
    from services.coordinator.ops.store import RunState, RunStore

    port, data = free_port(), tmp_path / "redis"
    url = f"redis://127.0.0.1:{port}/0"

    async def leave_running() -> str:
        store = RunStore.from_url(url)
        run = await store.create_run("left-run", "left", _config(str(tiny_model_dir)), 2)
        await store.set_state(run["id"], RunState.RUNNING)
        await store.close()
        return str(run["id"])

    redis_proc = start_redis(port, data)
    run_id = asyncio.run(leave_running())
    stop_process(redis_proc)  # the run is on disk; Redis is down when the coordinator starts

    settings = _settings(f"redis://127.0.0.1:{port}", tmp_path).model_copy(
        update={"redis_url": url, "resume_runs": True})
    with TestClient(create_app(settings)) as client:
        assert client.get("/readyz").status_code == 503
        redis_proc = start_redis(port, data)
        try:
            _wait_for_state(client, run_id, {"running"})
            held_runs.set()
            _wait_for_state(client, run_id, {"succeeded"})
        finally:
            stop_process(redis_proc)
