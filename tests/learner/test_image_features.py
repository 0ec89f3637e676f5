"""The learner's cache of the frozen vision tower's outputs per frame (services/learner/image_features.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from services.common.training import TrainSettings
from services.common.trajectory import Trajectory
from services.learner.batch import FrameProcessor, ModelSpec, PolicyBatch, collate, prepare_batch
from services.learner.image_features import ImageFeatureCache, usable
from services.learner.policy import add_lora, load_base_model, load_processor, token_logprobs
from services.learner.trainer import micro_batches
from tests.learner.conftest import adapter_weights
from tests.learner.settings import train_json


@pytest.fixture(scope="module")
def lora_model(tiny_model_dir: Path) -> Any:
    return add_lora(load_base_model(tiny_model_dir), TrainSettings())


@pytest.fixture
def make_batches(
    tiny_model_dir: Path, trajectories: list[Trajectory], lora_model: Any
) -> Callable[[], list[PolicyBatch]]:
    """Fresh micro-batches of 2 of the 6 trajectories (2 mazes x 3 episodes x 3 turns: 6 distinct
    frames among 18 images)."""
    spec = ModelSpec.from_config(lora_model.config)
    items = prepare_batch(trajectories, spec, FrameProcessor(load_processor(tiny_model_dir).image_processor))
    chunks = micro_batches(items, 2)
    return lambda: [collate(chunk, spec.pad_token_id, spec.image_token_id) for chunk in chunks]


def _logprobs_and_grads(
    model: Any, batches: list[PolicyBatch]
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    model.zero_grad()
    logprobs = []
    for batch in batches:
        values, _ = token_logprobs(model, batch, "cpu")
        (values * batch.loss_mask).sum().backward()
        logprobs.append(values.detach())
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    return logprobs, grads


def test_cached_features_give_the_logprobs_and_gradients_of_pixels(
    lora_model: Any, make_batches: Callable[[], list[PolicyBatch]]
) -> None:
    with torch.no_grad():  # a non-zero adapter, so that its gradients reach both LoRA factors
        for name, param in lora_model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05, generator=torch.Generator().manual_seed(0))
    plain = make_batches()
    expected, expected_grads = _logprobs_and_grads(lora_model, plain)
    assert sum(g.abs().sum() for g in expected_grads.values()) > 0

    cache = ImageFeatureCache(max_bytes=1 << 30)
    cached = make_batches()
    cache.attach(lora_model, cached, "cpu")
    assert (cache.misses, cache.hits, len(cache)) == (6, 0, 6)  # one tower run per distinct frame
    assert all(b.image_features is not None for b in cached)
    assert "pixel_values" not in cached[0].model_inputs("cpu")
    got, got_grads = _logprobs_and_grads(lora_model, cached)
    for a, b in zip(expected, got, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-5, atol=1e-7)

    again = make_batches()
    cache.attach(lora_model, again, "cpu")
    assert (cache.misses, cache.hits) == (6, 6)  # the next step's frames come from the cache


def test_batches_whose_images_carry_no_digest_keep_their_pixels(
    lora_model: Any, make_batches: Callable[[], list[PolicyBatch]]
) -> None:
    batches = [dataclasses.replace(b, image_keys=[]) for b in make_batches()]
    cache = ImageFeatureCache(max_bytes=1 << 30)
    cache.attach(lora_model, batches, "cpu")
    assert cache.misses == 0 and all(b.image_features is None for b in batches)
    assert "pixel_values" in batches[0].model_inputs("cpu")


def test_the_cache_keeps_within_its_memory_and_still_serves_the_whole_step(
    lora_model: Any, make_batches: Callable[[], list[PolicyBatch]]
) -> None:
    probe = ImageFeatureCache(max_bytes=1 << 30)
    probe.attach(lora_model, make_batches(), "cpu")
    per_frame = probe.num_bytes // len(probe)
    small = ImageFeatureCache(max_bytes=2 * per_frame)
    batches = make_batches()
    small.attach(lora_model, batches, "cpu")
    assert len(small) == 2 and small.num_bytes <= small.max_bytes
    assert all(b.image_features is not None for b in batches)
    expected, _ = _logprobs_and_grads(lora_model, make_batches())
    got, _ = _logprobs_and_grads(lora_model, batches)
    for a, b in zip(expected, got, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="max_bytes"):
        ImageFeatureCache(max_bytes=0)


def test_a_trainable_vision_tower_or_a_sharded_model_turns_the_cache_off(
    tiny_model_dir: Path, lora_model: Any
) -> None:
    assert usable(lora_model, sharded=False)
    assert not usable(lora_model, sharded=True)
    model = add_lora(load_base_model(tiny_model_dir), TrainSettings())
    model.get_parameter("base_model.model.model.visual.merger.linear_fc2.weight").requires_grad_(True)
    assert not usable(model, sharded=False)


def test_the_learner_trains_the_same_with_and_without_the_cache(
    make_driver: Callable[..., Any], trajectories: list[Trajectory]
) -> None:
    results = []
    for image_cache_mb in (0, 64):
        driver = make_driver(image_cache_mb=image_cache_mb)
        driver.configure("run", train_json(learning_rate=0.01, micro_batch_size=4))
        metrics = [driver.train_step("run", trajectories).metrics for _ in range(2)]
        results.append((driver, metrics, adapter_weights(driver)))
    (off, metrics_off, weights_off), (on, metrics_on, weights_on) = results
    assert off.engine.run.images is None
    assert (on.engine.run.images.misses, on.engine.run.images.hits) == (6, 6)
    assert [(m["train/image_frames_encoded"], m["train/image_frames_cached"]) for m in metrics_on] == [
        (6.0, 0.0), (0.0, 6.0)
    ]
    assert "train/image_frames_encoded" not in metrics_off[0]
    for step_off, step_on in zip(metrics_off, metrics_on, strict=True):
        for key in ("train/loss", "train/grad_norm", "train/entropy"):
            assert step_on[key] == pytest.approx(step_off[key], rel=1e-5, abs=1e-7), key
    for name, weight in weights_off.items():
        torch.testing.assert_close(weights_on[name], weight, rtol=1e-5, atol=1e-7)
