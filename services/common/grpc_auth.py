"""Optional shared-token authentication of the gRPC services.

When `MMRL_GRPC_TOKEN` is set, every server refuses a call without the metadata
`authorization: Bearer <token>` with UNAUTHENTICATED, except the health and reflection services
(so that probes and `grpcurl list` work without the secret), and every channel made by
`services.common.grpc_server.channel` sends it. Unset (the local default), nothing is checked.
Network policies stay the second guard: the token proves the caller knows the deployment's secret,
they restrict who can connect at all.
"""

from __future__ import annotations

import collections
import hmac
import os
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

TOKEN_ENV = "MMRL_GRPC_TOKEN"
METADATA_KEY = "authorization"
# Probes and discovery answer without the token: they reveal nothing a port scan would not.
EXEMPT_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def token_from_env() -> str:
    return os.environ.get(TOKEN_ENV, "").strip()


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls that do not carry the shared token (health and reflection exempt)."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("an empty gRPC token would let every call through; leave the interceptor out instead")
        self._expected = f"Bearer {token}".encode()

    def _allowed(self, details: grpc.HandlerCallDetails) -> bool:
        method = details.method or ""
        if method.startswith(EXEMPT_PREFIXES):
            return True
        given = dict(details.invocation_metadata or ()).get(METADATA_KEY, "")
        given_bytes = given.encode() if isinstance(given, str) else bytes(given)
        return hmac.compare_digest(given_bytes, self._expected)

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or self._allowed(handler_call_details):
            return handler
        assert handler.unary_unary is not None, "MMRL services are unary; a streaming method needs its own denial"
        method = handler_call_details.method

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                f"{method} needs the deployment's gRPC token ({TOKEN_ENV}) as "
                                f"'{METADATA_KEY}: Bearer <token>' metadata")

        return grpc.unary_unary_rpc_method_handler(deny, request_deserializer=handler.request_deserializer,
                                                   response_serializer=handler.response_serializer)


class TokenClientInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """Adds the shared token to every unary call of a channel."""

    def __init__(self, token: str) -> None:
        self._metadata = (METADATA_KEY, f"Bearer {token}")

    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        metadata = list(client_call_details.metadata or ()) + [self._metadata]
        details = client_call_details._replace(metadata=grpc.aio.Metadata(*metadata))
        return await continuation(details, request)


class _CallDetails(
    collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready",
                                            "compression")),
    grpc.ClientCallDetails,
):
    pass


class SyncTokenClientInterceptor(grpc.UnaryUnaryClientInterceptor):
    """`TokenClientInterceptor` for blocking channels."""

    def __init__(self, token: str) -> None:
        self._metadata = (METADATA_KEY, f"Bearer {token}")

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        d = client_call_details
        metadata = [*(d.metadata or ()), self._metadata]
        return continuation(_CallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready,
                                         d.compression), request)


def server_interceptors(token: str | None = None) -> list[grpc.aio.ServerInterceptor]:
    """The auth interceptor when a token is configured (`token`, else MMRL_GRPC_TOKEN); none otherwise."""
    token = token_from_env() if token is None else token
    return [TokenAuthInterceptor(token)] if token else []


def client_interceptors(token: str | None = None) -> list[grpc.aio.ClientInterceptor]:
    token = token_from_env() if token is None else token
    return [TokenClientInterceptor(token)] if token else []


def sync_client_interceptors(token: str | None = None) -> list[grpc.UnaryUnaryClientInterceptor]:
    token = token_from_env() if token is None else token
    return [SyncTokenClientInterceptor(token)] if token else []
