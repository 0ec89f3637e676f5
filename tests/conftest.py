"""Fixtures shared by every test package, and one guard on pytest's log capture."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from _pytest.logging import catching_logs


def _hold_the_logging_lock_while_capture_attaches() -> None:
    """pytest's log capture attaches its handler at every test phase by walking logging's dict of
    loggers without logging's lock. A thread that creates a logger meanwhile (a TestClient's app or a
    gRPC server importing a module) then fails the test with 'dictionary changed size during
    iteration'. logging.getLogger adds loggers under that lock, so holding it here rules the race out."""
    enter = catching_logs.__enter__
    if getattr(enter, "holds_logging_lock", False):
        return

    def locked_enter(self: catching_logs[Any]) -> Any:
        with logging._lock:  # type: ignore[attr-defined]  # the lock Manager.getLogger holds
            return enter(self)

    locked_enter.holds_logging_lock = True  # type: ignore[attr-defined]
    catching_logs.__enter__ = locked_enter  # type: ignore[method-assign]


_hold_the_logging_lock_while_capture_attaches()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly built tiny random-initialised Qwen3-VL model directory (built once per session)."""
    from mmrl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)
