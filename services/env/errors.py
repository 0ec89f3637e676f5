"""Errors of the environment, each with the gRPC status code the service answers with.

The maze logic stays free of grpc: the servicer maps `ErrorCode` names onto `grpc.StatusCode`.
Messages start with the offending field, e.g. "specs[3].options.size: must be odd, got 8".
"""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    UNAVAILABLE = "UNAVAILABLE"


class EnvError(Exception):
    """A request the environment refuses; nothing was changed."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(field: str, problem: str) -> EnvError:
    return EnvError(ErrorCode.INVALID_ARGUMENT, f"{field}: {problem}")
