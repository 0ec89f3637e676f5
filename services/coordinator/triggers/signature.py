"""The X-MMRL-Signature header, for senders that cannot send a bearer token but can sign.

    X-MMRL-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + raw body)>

The timestamp is signed with the body, so a captured request cannot be replayed once it is older
than the tolerance (and within it, the event's dedupe key makes a replay start nothing)."""

from __future__ import annotations

import hashlib
import hmac
import time

HEADER = "X-MMRL-Signature"


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The header value for `body` signed now (or at `timestamp`)."""
    t = int(time.time()) if timestamp is None else timestamp
    return f"t={t},v1={_digest(secret, t, body)}"


def verify(secret: str, header: str, body: bytes, tolerance_s: float, now: float | None = None) -> str:
    """'' when the header signs `body` with `secret` within the tolerance, else why not."""
    fields = dict(part.strip().split("=", 1) for part in header.split(",") if "=" in part)
    try:
        t = int(fields["t"])
    except (KeyError, ValueError):
        return f"{HEADER} must read t=<unix seconds>,v1=<hex>"
    if abs((time.time() if now is None else now) - t) > tolerance_s:
        return f"{HEADER} timestamp is more than {tolerance_s:g} s from the coordinator's clock"
    if not hmac.compare_digest(fields.get("v1", "").encode(), _digest(secret, t, body).encode()):
        return f"{HEADER} does not match the body"
    return ""


def _digest(secret: str, t: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
