"""Errors the rollout service turns into gRPC status codes.

Modules below the servicer raise these; the servicer aborts the call with `code` and the message,
so every refusal says what was wrong and the service keeps serving.
"""

from __future__ import annotations

import grpc


class RolloutError(Exception):
    """Base class; `code` is the gRPC status the servicer answers with."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgument(RolloutError):
    """The request itself is wrong (bad tokens, undecodable image, path outside the shared root)."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(RolloutError):
    """An adapter version that was never loaded or has left the retention window."""

    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(RolloutError):
    """The system is not in a state to do this (checksum mismatch, sleep mode on CPU, Generate while
    asleep, LoadAdapter with LoRA disabled)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class DeadlineExceeded(RolloutError):
    """The caller's deadline passed before the call could act (a Sleep that waited for Generate
    calls to end)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unavailable(RolloutError):
    """The engine is starting or dead (worth retrying)."""

    code = grpc.StatusCode.UNAVAILABLE
