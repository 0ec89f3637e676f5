"""The S3 "object created" events AWS sends, read into one shape.

Accepted bodies:
- an EventBridge event: {"detail-type": "Object Created", "source": "aws.s3", "detail": {"bucket":
  {"name"}, "object": {"key", "size", "etag", "version-id", "sequencer"}}, "id", "time", ...};
- an S3 event notification: {"Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
  "eventTime", "s3": {"bucket": {"name"}, "object": {"key", "size", "eTag", "versionId",
  "sequencer"}}}]}, as S3 delivers it to SQS;
- the same notification wrapped by SNS: {"Type": "Notification", "MessageId", "Message": "<JSON>"}.
S3 URL-encodes keys in all of them (a space as '+'); ObjectEvent.key is the decoded key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import unquote_plus


class UnknownEvent(ValueError):
    """The body is not an S3 object-created event this endpoint understands (HTTP 400)."""


@dataclass(frozen=True)
class ObjectEvent:
    """One new object, whichever way its event came."""

    source: str  # eventbridge, s3-notification, sns or inbox
    bucket: str
    key: str
    version: str  # what tells this object version from another: version id, else etag, else sequencer
    etag: str = ""
    version_id: str = ""
    sequencer: str = ""
    size: int | None = None
    time: str = ""  # when the object was created, as the event says
    event_id: str = ""  # EventBridge id or SNS MessageId

    @property
    def dedupe_key(self) -> str:
        """The same for every delivery of this object version, by any route (EventBridge, SQS, SNS)."""
        return hashlib.sha256(f"{self.bucket}\0{self.key}\0{self.version}".encode()).hexdigest()

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def record(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in ("", None)}


def parse_body(body: Any) -> tuple[list[ObjectEvent], str]:
    """The object events in a request body, and a note when the body is a known event that starts
    nothing (S3's test event). UnknownEvent says why a body is not understood."""
    if not isinstance(body, dict):
        raise UnknownEvent(f"expected a JSON object, got {type(body).__name__}")
    if body.get("source") == "aws.s3" and "detail-type" in body:
        return [_eventbridge(body)], ""
    if body.get("Type") == "Notification" and "Message" in body:
        try:
            message = json.loads(body["Message"])
        except (TypeError, json.JSONDecodeError):
            raise UnknownEvent("SNS notification whose Message is not JSON") from None
        events, note = _notification(message, "sns")
        return [_with_event_id(e, str(body.get("MessageId", ""))) for e in events], note
    if body.get("Type") == "SubscriptionConfirmation":
        raise UnknownEvent("SNS subscription confirmation: subscribe an SQS queue, not this endpoint "
                           "(docs/triggers.md)")
    return _notification(body, "s3-notification")


def _eventbridge(body: dict[str, Any]) -> ObjectEvent:
    if body["detail-type"] != "Object Created":
        raise UnknownEvent(f"EventBridge event of detail-type {body['detail-type']!r}: only 'Object Created' "
                           "starts runs")
    detail = body.get("detail")
    obj = _mapping(detail, "object", "detail")
    bucket = _mapping(detail, "bucket", "detail")
    return _event("eventbridge", bucket, obj, etag=obj.get("etag"), version_id=obj.get("version-id"),
                  time=body.get("time"), event_id=body.get("id"))


def _notification(body: dict[str, Any], source: str) -> tuple[list[ObjectEvent], str]:
    if body.get("Event") == "s3:TestEvent":
        return [], "s3:TestEvent (sent when a notification is configured): nothing to start"
    records = body.get("Records")
    if not isinstance(records, list) or not records:
        raise UnknownEvent("not an S3 event: expected an EventBridge 'Object Created' event, an S3 event "
                           "notification ({'Records': [...]}) or an SNS notification wrapping one")
    events = []
    for record in records:
        if not isinstance(record, dict) or record.get("eventSource") != "aws:s3":
            raise UnknownEvent("a record whose eventSource is not aws:s3")
        name = str(record.get("eventName", ""))
        if not name.startswith("ObjectCreated:"):
            raise UnknownEvent(f"S3 event {name!r}: only ObjectCreated:* starts runs")
        s3 = record.get("s3")
        obj = _mapping(s3, "object", "s3")
        events.append(_event(source, _mapping(s3, "bucket", "s3"), obj, etag=obj.get("eTag"),
                             version_id=obj.get("versionId"), time=record.get("eventTime")))
    return events, ""


def _event(source: str, bucket: dict[str, Any], obj: dict[str, Any], *, etag: Any, version_id: Any,
           time: Any, event_id: Any = "") -> ObjectEvent:
    if not isinstance(bucket.get("name"), str) or not bucket["name"]:
        raise UnknownEvent("the event names no bucket")
    if not isinstance(obj.get("key"), str) or not obj["key"]:
        raise UnknownEvent("the event names no object key")
    etag_s, version_s, sequencer = str(etag or "").strip('"'), str(version_id or ""), str(obj.get("sequencer") or "")
    version = version_s or etag_s or sequencer
    if not version:
        raise UnknownEvent("the event has no version id, etag or sequencer to tell one delivery from another")
    size = obj.get("size")
    return ObjectEvent(source=source, bucket=bucket["name"], key=unquote_plus(obj["key"]), version=version,
                       etag=etag_s, version_id=version_s, sequencer=sequencer,
                       size=size if isinstance(size, int) else None, time=str(time or ""),
                       event_id=str(event_id or ""))


def _with_event_id(event: ObjectEvent, event_id: str) -> ObjectEvent:
    return ObjectEvent(**{**asdict(event), "event_id": event_id})


def _mapping(parent: Any, field: str, where: str) -> dict[str, Any]:
    value = parent.get(field) if isinstance(parent, dict) else None
    if not isinstance(value, dict):
        raise UnknownEvent(f"the event has no {where}.{field} object")
    return value
