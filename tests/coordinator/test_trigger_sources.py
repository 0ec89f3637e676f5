"""Where trigger configs are read: S3 through boto3 against a local S3-compatible server (moto in
server mode on loopback), and the mounted-bucket directory; and the event shapes read into one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from services.coordinator.api.app import create_app
from services.coordinator.triggers.events import UnknownEvent, parse_body
from services.coordinator.triggers.sources import FilesystemSource, S3Source, SourceError
from tests.coordinator.triggers_support import (
    BUCKET,
    TOKEN,
    eventbridge,
    run_config,
    s3_notification,
    settings,
    sns,
    trigger_settings,
)

boto3 = pytest.importorskip("boto3")


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on a free loopback port."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> object:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    if BUCKET not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=BUCKET)
        client.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    return client


def test_the_s3_source_reads_an_object_version_and_refuses_missing_and_oversized_ones(
        s3: object, s3_endpoint: str) -> None:
    first = s3.put_object(Bucket=BUCKET, Key="cfg/a b.yaml", Body=b"name: one\n")  # type: ignore[attr-defined]
    s3.put_object(Bucket=BUCKET, Key="cfg/a b.yaml", Body=b"name: two\n")  # type: ignore[attr-defined]
    source = S3Source(s3_endpoint)
    assert source.read(BUCKET, "cfg/a b.yaml", "", 1024) == b"name: two\n"
    assert source.read(BUCKET, "cfg/a b.yaml", first["VersionId"], 1024) == b"name: one\n"
    with pytest.raises(SourceError, match="cannot read s3://"):
        source.read(BUCKET, "cfg/absent.yaml", "", 1024)
    with pytest.raises(ValueError, match="over the 4-byte limit"):
        source.read(BUCKET, "cfg/a b.yaml", "", 4)


def test_an_eventbridge_event_starts_the_run_whose_config_the_coordinator_reads_from_s3(
        s3: object, s3_endpoint: str, redis_url: str, tmp_path: Path) -> None:
    redis.Redis.from_url(f"{redis_url}/3").flushdb()
    put = s3.put_object(Bucket=BUCKET, Key="mmrl/configs/from s3.yaml",  # type: ignore[attr-defined]
                        Body=json.dumps(run_config("from-s3")).encode())
    rules = [{"name": "configs", "pattern": "mmrl/configs/*", "action": "config"}]
    app = create_app(settings(redis_url, tmp_path / "shared"), trigger_settings=trigger_settings(
        rules, tmp_path, object_source="s3", s3_endpoint_url=s3_endpoint))
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        event = eventbridge("mmrl/configs/from+s3.yaml", put["ETag"].strip('"'), version_id=put["VersionId"])
        reply = client.post("/v1/triggers/s3", json=event)
        assert reply.status_code == 201, reply.text
        [run] = client.get("/v1/runs").json()["runs"]
        assert run["name"] == "from-s3" and run["trigger"]["version_id"] == put["VersionId"]


def test_the_filesystem_source_reads_under_its_bucket_and_nowhere_else(tmp_path: Path) -> None:
    (tmp_path / "b" / "cfg").mkdir(parents=True)
    (tmp_path / "b" / "cfg" / "x.yaml").write_text("name: x\n")
    (tmp_path / "secret.txt").write_text("no")
    source = FilesystemSource(tmp_path)
    assert source.read("b", "cfg/x.yaml", "", 1024) == b"name: x\n"
    for bucket, key in (("b", "../secret.txt"), ("..", "secret.txt"), ("b/..", "secret.txt")):
        with pytest.raises(ValueError):
            source.read(bucket, key, "", 1024)
    with pytest.raises(SourceError):
        source.read("b", "cfg/absent.yaml", "", 1024)


def test_every_route_of_one_object_version_reads_as_the_same_event_with_its_key_decoded() -> None:
    routes = [eventbridge("data/a+b%2Bc.yaml", "e1"), s3_notification("data/a+b%2Bc.yaml", '"e1"'),
              sns(s3_notification("data/a+b%2Bc.yaml", "e1"))]
    events = [parse_body(body)[0][0] for body in routes]
    assert [e.source for e in events] == ["eventbridge", "s3-notification", "sns"]
    assert {e.key for e in events} == {"data/a b+c.yaml"}
    assert {e.dedupe_key for e in events} == {events[0].dedupe_key}
    versioned = parse_body(eventbridge("k", "e1", version_id="v7"))[0][0]
    assert versioned.version == "v7" and versioned.dedupe_key != events[0].dedupe_key


@pytest.mark.parametrize("body, words", [
    ([1, 2], "expected a JSON object"),
    ({"Records": []}, "not an S3 event"),
    ({"Records": [{"eventSource": "aws:sqs"}]}, "not aws:s3"),
    ({"Records": [{**s3_notification("k", "e")["Records"][0], "eventName": "ObjectRemoved:Delete"}]}, "ObjectRemoved"),
    ({"Type": "Notification", "Message": "{not json"}, "not JSON"),
    ({"Type": "SubscriptionConfirmation", "SubscribeURL": "https://example.invalid"}, "subscription confirmation"),
    ({**eventbridge("k", ""), "detail": {"bucket": {"name": "b"}, "object": {"key": "k"}}}, "no version id"),
    ({**eventbridge("k", "e"), "detail": {"object": {"key": "k", "etag": "e"}}}, "detail.bucket"),
])
def test_bodies_that_are_not_object_created_events_are_refused_with_the_reason(body: object, words: str) -> None:
    with pytest.raises(UnknownEvent, match=words):
        parse_body(body)


def test_the_hyperpod_rules_file_validates_and_its_dataset_rule_starts_the_mounted_run_defaults() -> None:
    from services.coordinator.config import load_run_config
    from services.coordinator.triggers.settings import TriggerSettings

    overlay = Path(__file__).parents[2] / "deploy" / "k8s" / "overlays" / "hyperpod"
    rules = TriggerSettings(rules_file=overlay / "trigger-rules.yaml").load_rules()
    dataset = rules.match("amzn-s3-demo-bucket1", "mmrl/datasets/mazes.jsonl")
    assert dataset is not None and dataset.config == Path("/etc/mmrl/run-defaults.yaml")
    assert rules.match("amzn-s3-demo-bucket1", "mmrl/configs/a.yaml").action == "config"  # type: ignore[union-attr]
    load_run_config(overlay / dataset.config.name, {"env.options.dataset": "s3://b/k"})  # the mounted file
