"""Event bodies in the shapes AWS sends, and a coordinator app wired for trigger tests."""

from __future__ import annotations

import itertools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from fastapi.testclient import TestClient

from services.common.procs import free_port
from services.coordinator.config import CoordinatorSettings
from services.coordinator.triggers.settings import TriggerSettings

TOKEN = "trigger-test-token"
BUCKET = "amzn-s3-demo-bucket1"


def eventbridge(key: str, etag: str, bucket: str = BUCKET, version_id: str = "") -> dict[str, Any]:
    """An EventBridge 'Object Created' event as S3 sends it (the AWS S3 user guide's example)."""
    obj: dict[str, Any] = {"key": key, "size": 5, "etag": etag, "sequencer": "00617F08299329D189"}
    if version_id:
        obj["version-id"] = version_id
    return {
        "version": "0", "id": "17793124-05d4-b198-2fde-7ededc63b103", "detail-type": "Object Created",
        "source": "aws.s3", "account": "111122223333", "time": "2021-11-12T00:00:00Z", "region": "ca-central-1",
        "resources": [f"arn:aws:s3:::{bucket}"],
        "detail": {"version": "0", "bucket": {"name": bucket}, "object": obj,
                   "request-id": "N4N7GDK58NMKJ12R", "requester": "123456789012",
                   "source-ip-address": "1.2.3.4", "reason": "PutObject"},
    }


def s3_notification(key: str, etag: str, bucket: str = BUCKET) -> dict[str, Any]:
    """An S3 event notification (event structure 2.1) as S3 delivers it to SQS."""
    return {"Records": [{
        "eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "ca-central-1",
        "eventTime": "2021-11-12T00:00:00.000Z", "eventName": "ObjectCreated:Put",
        "userIdentity": {"principalId": "AWS:AIDAEXAMPLE"}, "requestParameters": {"sourceIPAddress": "1.2.3.4"},
        "responseElements": {"x-amz-request-id": "C3D13FE58DE4C810", "x-amz-id-2": "FMyUVURIY8/IgAtTv8xRjskZQpcIZ9KG4V5Wp6S7S/JRWeUWerMUE5JgHvANOjpD"},
        "s3": {"s3SchemaVersion": "1.0", "configurationId": "mmrl-configs",
               "bucket": {"name": bucket, "ownerIdentity": {"principalId": "A3NL1KOZZKExample"},
                          "arn": f"arn:aws:s3:::{bucket}"},
               "object": {"key": key, "size": 5, "eTag": etag, "sequencer": "0055AED6DCD90281E5"}},
    }]}


def sns(message: dict[str, Any]) -> dict[str, Any]:
    """An SNS notification wrapping `message`, as SNS delivers it to an SQS queue (raw delivery off)."""
    return {
        "Type": "Notification", "MessageId": "22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324",
        "TopicArn": "arn:aws:sns:ca-central-1:111122223333:mmrl-objects", "Subject": "Amazon S3 Notification",
        "Message": json.dumps(message), "Timestamp": "2021-11-12T00:00:00.100Z", "SignatureVersion": "1",
        "Signature": "EXAMPLE", "SigningCertURL": "https://sns.ca-central-1.amazonaws.com/cert.pem",
        "UnsubscribeURL": "https://sns.ca-central-1.amazonaws.com/?Action=Unsubscribe",
    }


# Learner addresses a run config may name (the coordinator refuses others): one per run of a test.
LEARNERS = [f"127.0.0.1:{free_port()}" for _ in range(64)]
_next_learner = itertools.cycle(LEARNERS)


def run_config(name: str = "triggered", **overrides: Any) -> dict[str, Any]:
    """A run config whose learner address is its own (no two test runs wait on one learner)."""
    return {"name": name, "model": "some/model", "steps": 2,
            "endpoints": {"learner": next(_next_learner)}, **overrides}


def put_object(buckets: Path, key: str, config: dict[str, Any], bucket: str = BUCKET) -> Path:
    path = buckets / bucket / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def settings(redis_url: str, shared: Path, token: str = TOKEN) -> CoordinatorSettings:
    dead = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    return CoordinatorSettings(redis_url=f"{redis_url}/3", api_token=token, shared_root=shared, env_addr=dead[0],
                               rollout_addrs=dead[1], learner_addrs=dead[2], rpc_timeout_s=5, rpc_retries=0,
                               resume_runs=False, allowed_models=f"some/model,{tempfile.gettempdir()}", allowed_endpoints=",".join(LEARNERS))


def trigger_settings(rules: list[dict[str, Any]], tmp_path: Path, **fields: Any) -> TriggerSettings:
    rules_file = tmp_path / "trigger-rules.yaml"
    rules_file.write_text(yaml.safe_dump({"rules": rules}))
    return TriggerSettings(rules_file=rules_file, **{"inbox_poll_s": 0.0, **fields})


def wait_for(client: TestClient, path: str, done: Any, timeout_s: float = 20) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reply = client.get(path).json()
        if done(reply):
            return reply
        time.sleep(0.05)
    raise AssertionError(f"{path} never got there: {reply}")
