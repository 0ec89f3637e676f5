"""POST /v1/triggers/s3 against a real coordinator app and a real Redis: the event shapes AWS sends
start one run each, redeliveries none; bad signatures, shapes, keys and configs start nothing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from services.coordinator.api.app import create_app
from services.coordinator.ops.store import AlreadyClaimed, RunStore
from services.coordinator.triggers import signature
from tests.coordinator.triggers_support import (
    BUCKET,
    TOKEN,
    eventbridge,
    put_object,
    run_config,
    s3_notification,
    settings,
    sns,
    trigger_settings,
    wait_for,
)

SECRET = "hmac-shared-secret"
RULES = [
    {"name": "run-configs", "bucket": BUCKET, "pattern": "mmrl/configs/*.yaml", "action": "config"},
    {"name": "datasets", "pattern": "mmrl/datasets/*.jsonl", "action": "dataset", "config": "PLACEHOLDER"},
]


@pytest.fixture
def app_parts(redis_url: str, tmp_path: Path) -> tuple[object, object]:
    redis.Redis.from_url(f"{redis_url}/3").flushdb()
    named = tmp_path / "dataset-run.yaml"
    named.write_text(json.dumps(run_config("dataset-run", env={"options": {"goal": "3,3"}})))
    rules = [dict(r, config=str(named)) if r["action"] == "dataset" else r for r in RULES]
    return (settings(redis_url, tmp_path / "shared"),
            trigger_settings(rules, tmp_path, hmac_secret=SECRET, buckets_dir=tmp_path / "buckets"))


@pytest.fixture
def client(app_parts: tuple) -> Iterator[TestClient]:
    with TestClient(create_app(app_parts[0], trigger_settings=app_parts[1])) as test_client:
        test_client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield test_client


def _runs(client: TestClient, **query: str) -> list[dict]:
    return client.get("/v1/runs", params=query).json()["runs"]  # type: ignore[no-any-return]


def test_an_eventbridge_object_created_event_starts_one_run_that_records_the_event(
        client: TestClient, tmp_path: Path) -> None:
    put_object(tmp_path / "buckets", "mmrl/configs/first try.yaml", run_config("from-eventbridge"))
    reply = client.post("/v1/triggers/s3", json=eventbridge("mmrl/configs/first+try.yaml", "b1946ac92492d2347c62"))
    assert reply.status_code == 201, reply.text
    [outcome] = reply.json()["outcomes"]
    assert outcome["outcome"] == "started" and outcome["rule"] == "run-configs"
    [run] = _runs(client)
    assert run["id"] == outcome["run_id"] and run["name"] == "from-eventbridge"
    trigger = run["trigger"]
    assert (trigger["source"], trigger["bucket"], trigger["key"]) == ("eventbridge", BUCKET, "mmrl/configs/first try.yaml")
    assert trigger["etag"] == "b1946ac92492d2347c62" and trigger["time"] == "2021-11-12T00:00:00Z"
    assert [r["id"] for r in _runs(client, trigger_key="mmrl/configs/first try.yaml",
                                   trigger_source="eventbridge")] == [run["id"]]
    assert _runs(client, trigger_source="sns") == [] and _runs(client, trigger_bucket="other") == []
    # It is a run like any other: driven, and failing here because no service answers.
    failed = wait_for(client, f"/v1/runs/{run['id']}", lambda r: r["state"] == "failed")
    assert "env service" in failed["failure_reason"]


def test_an_sns_wrapped_s3_notification_starts_one_run_and_redeliveries_by_any_route_start_none(
        client: TestClient, tmp_path: Path) -> None:
    put_object(tmp_path / "buckets", "mmrl/configs/run.yaml", run_config("from-sns"))
    body = sns(s3_notification("mmrl/configs/run.yaml", "0123456789abcdef"))
    first = client.post("/v1/triggers/s3", json=body)
    assert first.status_code == 201, first.text
    run_id = first.json()["outcomes"][0]["run_id"]
    assert _runs(client)[0]["trigger"]["source"] == "sns"
    assert _runs(client)[0]["trigger"]["event_id"] == body["MessageId"]

    again = [client.post("/v1/triggers/s3", json=b) for b in (
        body, s3_notification("mmrl/configs/run.yaml", "0123456789abcdef"),  # SQS redelivery, SQS without SNS
        eventbridge("mmrl/configs/run.yaml", "0123456789abcdef"))]           # and EventBridge, same version
    assert [r.status_code for r in again] == [200, 200, 200]
    assert {r.json()["outcomes"][0]["outcome"] for r in again} == {"duplicate"}
    assert {r.json()["outcomes"][0]["run_id"] for r in again} == {run_id}
    assert len(_runs(client)) == 1

    # A new version of the object is a new event.
    assert client.post("/v1/triggers/s3", json=s3_notification("mmrl/configs/run.yaml", "fedcba98")).status_code == 201
    assert len(_runs(client)) == 2
    audit = client.get("/v1/triggers/events", params={"key": "mmrl/configs/run.yaml"}).json()["events"]
    assert [e["outcome"] for e in audit] == ["started", "duplicate", "duplicate", "duplicate", "started"][::-1]


def test_concurrent_deliveries_of_one_event_claim_it_once(redis_url: str) -> None:
    async def deliver_five_times() -> list[object]:
        store = RunStore.from_url(f"{redis_url}/3")
        await store.r.flushdb()
        results = await asyncio.gather(*(store.create_run(f"run-{i}", "r", {}, 1, trigger={"key": "k"}, claim="same")
                                         for i in range(5)), return_exceptions=True)
        runs = await store.list_runs()
        await store.close()
        return [results, runs]

    results, runs = asyncio.run(deliver_five_times())
    assert sum(not isinstance(r, Exception) for r in results) == 1  # type: ignore[attr-defined]
    assert all(isinstance(r, AlreadyClaimed) for r in results if isinstance(r, Exception))  # type: ignore[attr-defined]
    assert len(runs) == 1 and runs[0]["trigger"] == {"key": "k"}  # type: ignore[index]


def test_signatures_authenticate_senders_without_a_token_and_a_bad_one_is_401(
        client: TestClient, tmp_path: Path) -> None:
    put_object(tmp_path / "buckets", "mmrl/configs/signed.yaml", run_config("signed"))
    body = json.dumps(eventbridge("mmrl/configs/signed.yaml", "aa11")).encode()
    no_token = {"Authorization": "", "Content-Type": "application/json"}
    assert client.post("/v1/triggers/s3", content=body, headers=no_token).status_code == 401
    wrong = {**no_token, signature.HEADER: signature.sign("not-the-secret", body)}
    assert client.post("/v1/triggers/s3", content=body, headers=wrong).status_code == 401
    stale = {**no_token, signature.HEADER: signature.sign(SECRET, body, int(time.time()) - 3600)}
    reply = client.post("/v1/triggers/s3", content=body, headers=stale)
    assert reply.status_code == 401 and "timestamp" in reply.json()["detail"]
    tampered = {**no_token, signature.HEADER: signature.sign(SECRET, body)}
    assert client.post("/v1/triggers/s3", content=body.replace(b"signed", b"signef"), headers=tampered).status_code == 401
    assert _runs(client) == []
    assert client.get("/v1/triggers/events").json()["events"] == []  # unauthenticated requests are not events

    good = {**no_token, signature.HEADER: signature.sign(SECRET, body)}
    assert client.post("/v1/triggers/s3", content=body, headers=good).status_code == 201
    assert client.get("/v1/triggers/events", headers={"Authorization": ""}).status_code == 401


def test_an_invalid_config_is_rejected_naming_the_field_and_starts_no_run(client: TestClient, tmp_path: Path) -> None:
    put_object(tmp_path / "buckets", "mmrl/configs/bad.yaml", run_config("bad", grpo={"group_size": 1}, colour="red"))
    reply = client.post("/v1/triggers/s3", json=eventbridge("mmrl/configs/bad.yaml", "cc22"))
    assert reply.status_code == 422
    assert "grpo.group_size" in reply.json()["detail"] and "colour" in reply.json()["detail"]
    assert _runs(client) == []
    [event] = client.get("/v1/triggers/events", params={"outcome": "rejected"}).json()["events"]
    assert "grpo.group_size" in event["reason"] and event["event"]["key"] == "mmrl/configs/bad.yaml"
    # Mended under the same key (a new version), it starts.
    put_object(tmp_path / "buckets", "mmrl/configs/bad.yaml", run_config("mended"))
    assert client.post("/v1/triggers/s3", json=eventbridge("mmrl/configs/bad.yaml", "dd33")).status_code == 201


def test_unknown_shapes_unmatched_keys_and_unreadable_objects_start_nothing_and_are_recorded(
        client: TestClient) -> None:
    deleted = {**eventbridge("mmrl/configs/x.yaml", "e1"), "detail-type": "Object Deleted"}
    cases = [
        (client.post("/v1/triggers/s3", content=b"not json{"), 400, "not JSON"),
        (client.post("/v1/triggers/s3", json={"hello": "world"}), 400, "not an S3 event"),
        (client.post("/v1/triggers/s3", json=deleted), 400, "Object Deleted"),
        (client.post("/v1/triggers/s3", json=eventbridge("elsewhere/x.yaml", "e2")), 422, "no trigger rule matches"),
        (client.post("/v1/triggers/s3", json=eventbridge("mmrl/configs/x.yaml", "e3", bucket="other")), 422,
         "no trigger rule matches s3://other/"),
        (client.post("/v1/triggers/s3", json=eventbridge("mmrl/configs/absent.yaml", "e4")), 502, "cannot read"),
    ]
    for reply, code, words in cases:
        assert reply.status_code == code, reply.text
        assert words in reply.json()["detail"], reply.json()
    test_event = {"Service": "Amazon S3", "Event": "s3:TestEvent", "Time": "2021-11-12T00:00:00.000Z",
                  "Bucket": BUCKET, "RequestId": "5582815E1AEA5ADF", "HostId": "8cLeGAmw098X5cv4Zkwcmo8vvZa3eH3eKxsPzbB9wrR+YstdA6Knx4Ip8EXAMPLE"}
    ignored = client.post("/v1/triggers/s3", json=test_event)
    assert ignored.status_code == 200 and ignored.json()["outcomes"][0]["outcome"] == "ignored"
    assert _runs(client) == []
    audit = client.get("/v1/triggers/events").json()["events"]
    assert [e["outcome"] for e in audit] == ["ignored"] + ["rejected"] * len(cases)
    assert audit[-2]["event"]["body"].startswith("'{")  # an unreadable event keeps its body, cut short


def test_a_dataset_object_starts_the_named_config_with_the_dataset_as_an_env_option(client: TestClient) -> None:
    reply = client.post("/v1/triggers/s3", json=s3_notification("mmrl/datasets/mazes%2B2026.jsonl", "ff44"))
    assert reply.status_code == 201, reply.text
    [run] = _runs(client)
    uri = f"s3://{BUCKET}/mmrl/datasets/mazes+2026.jsonl"
    assert run["name"] == "dataset-run" and run["trigger"]["dataset"] == uri and run["trigger"]["rule"] == "datasets"
    config = client.get(f"/v1/runs/{run['id']}").json()["config"]  # listings leave configs out
    assert config["env"]["options"] == {"goal": "3,3", "dataset": uri}


def test_an_event_during_a_run_on_the_same_learner_queues_its_run_which_starts_after_it(
        client: TestClient, tmp_path: Path, tiny_model_dir: Path, held_runs: object) -> None:
    config = run_config("busy", model=str(tiny_model_dir))
    put_object(tmp_path / "buckets", "mmrl/configs/one.yaml", config)
    put_object(tmp_path / "buckets", "mmrl/configs/two.yaml", {**config, "name": "two"})  # the same learner
    first = client.post("/v1/triggers/s3", json=eventbridge("mmrl/configs/one.yaml", "a1")).json()["outcomes"][0]
    wait_for(client, f"/v1/runs/{first['run_id']}", lambda r: r["state"] == "running")
    queued = client.post("/v1/triggers/s3", json=eventbridge("mmrl/configs/two.yaml", "b2"))
    assert queued.status_code == 201, queued.text
    second = queued.json()["outcomes"][0]["run_id"]
    assert client.get(f"/v1/runs/{second}").json()["queue_position"] == 1
    again = client.post("/v1/triggers/s3", json=eventbridge("mmrl/configs/two.yaml", "b2"))  # a redelivery
    assert again.status_code == 200 and again.json()["outcomes"][0]["run_id"] == second
    held_runs.set()  # type: ignore[attr-defined]
    wait_for(client, f"/v1/runs/{first['run_id']}", lambda r: r["state"] == "succeeded")
    wait_for(client, f"/v1/runs/{second}", lambda r: r["state"] == "succeeded")