"""Fixtures shared by every test package."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly built tiny random-initialised Qwen3-VL model directory (built once per session)."""
    from mmrl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)
