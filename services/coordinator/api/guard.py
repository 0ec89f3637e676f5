"""An ASGI middleware that guards the API before any route reads a body: the bearer token of /v1
routes is checked first, against every configured token (401 without reading the body; which tenant
it speaks for is the routes' business, api/deps.py), then the body size (413 over
`max_request_bytes`: by Content-Length before reading, and while reading a body sent without one)."""

from __future__ import annotations

import hmac
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Routes with an auth of their own (the S3 trigger also accepts a signed body, so it must read it).
OWN_AUTH = ("/v1/triggers/s3",)


async def _reply(send: Send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
           (b"connection", b"close")]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    def __init__(self, app: ASGIApp, tokens: list[str], max_bytes: int) -> None:
        self.app = app
        self.expected = [token.encode() for token in tokens]
        self.max_bytes = max_bytes

    def _authorized(self, scope: Scope) -> bool:
        path = scope.get("path", "")
        if not self.expected or not path.startswith("/v1/") or path in OWN_AUTH:
            return True
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        scheme, _, credentials = given.partition(b" ")
        matches = [hmac.compare_digest(credentials.strip(), token) for token in self.expected]  # each, every time
        return scheme.lower() == b"bearer" and any(matches)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._authorized(scope):
            await _reply(send, 401, "missing or invalid bearer token", {"WWW-Authenticate": "Bearer"})
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await _reply(send, 413, f"request body over {self.max_bytes} bytes (MMRL_MAX_REQUEST_BYTES)")
            return
        received = 0
        replied = False  # the 413 went out: whatever the app answers after it is dropped

        async def counted_receive() -> Message:
            nonlocal received, replied
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:  # a body sent without Content-Length
                    if not replied:
                        replied = True
                        await _reply(send, 413, f"request body over {self.max_bytes} bytes (MMRL_MAX_REQUEST_BYTES)")
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not replied:
                await send(message)

        await self.app(scope, counted_receive, guarded_send)


def install(app: Any, tokens: list[str], max_bytes: int) -> None:
    app.add_middleware(RequestGuard, tokens=tokens, max_bytes=max_bytes)
