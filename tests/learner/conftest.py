"""Fixtures of the learner tests: synthetic multi-turn trajectories (the coordinator's token
layout, a stand-in engine) and in-process single-rank learners."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from services.common.trajectory import Trajectory


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def trajectories(tokenizer: Any) -> list[Trajectory]:
    """2 groups x 3 episodes x 3 turns, one 80x80 frame (25 image tokens) per turn, advantages
    set so that no group sums to zero (non-trivial gradients)."""
    from mmrl.bench import synthetic
    from services.common.conversation import ChatTokens

    generate = synthetic.fake_generator(ChatTokens.from_tokenizer(tokenizer), tokenizer, tokens_per_image=25)
    played = synthetic.play_episodes(generate, tokenizer, num_groups=2, group_size=3, num_turns=3, seed=0)
    return synthetic.with_advantages(played, [1.0, -0.5, 0.25, -1.0, 0.75, 0.5])


@pytest.fixture
def make_driver(tiny_model_dir: Path, tmp_path: Path) -> Callable[..., Any]:
    """make_driver(shared_root=tmp_path/'shared', **settings) -> a single-rank LearnerDriver (a new engine)."""
    from services.learner.config import LearnerSettings
    from services.learner.distributed import init_distributed
    from services.learner.driver import LearnerDriver
    from services.learner.engine import LearnerEngine

    def make(shared_root: Path | None = None, **overrides: Any) -> LearnerDriver:
        settings = LearnerSettings(
            model=tiny_model_dir, shared_root=shared_root or tmp_path / "shared", num_threads=1, **overrides
        )  # the CPU is shared: no oversubscription
        return LearnerDriver(LearnerEngine(settings, init_distributed("cpu")))

    return make


def adapter_weights(driver: Any) -> dict[str, Any]:
    """The driver's current LoRA weights (full tensors, cloned)."""
    from services.learner.checkpoint import gather_adapter_state

    assert driver.engine.run is not None
    return {k: v.clone() for k, v in gather_adapter_state(driver.engine.run.model).items()}


def base_weights(driver: Any) -> dict[str, Any]:
    """The driver's frozen base weights (cloned)."""
    assert driver.engine.run is not None
    return {
        n: p.detach().clone() for n, p in driver.engine.run.model.named_parameters() if not p.requires_grad
    }
