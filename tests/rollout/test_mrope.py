"""services/rollout/mrope.py: the one-pass M-RoPE positions equal vLLM's own Qwen3-VL function."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from services.rollout import mrope

IMAGE = 9
CONFIG = SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=2), video_token_id=8,
                         vision_start_token_id=6, vision_end_token_id=7)


def _image(offset: int, height: int, width: int) -> Any:
    """A stand-in for vLLM's MultiModalFeatureSpec of one image: a (1, height, width) patch grid."""
    return SimpleNamespace(modality="image", mm_position=SimpleNamespace(offset=offset),
                           data={"image_grid_thw": SimpleNamespace(data=torch.tensor([1, height, width]))})


def _prompt(rng: random.Random) -> tuple[list[int], list[Any]]:
    """Text runs of 0-30 tokens (none before the first image or after the last, at times) around
    0-12 images of 1x1 to 6x6 merged cells."""
    tokens: list[int] = []
    features = []
    for _ in range(rng.randint(0, 12)):
        tokens += [1] * rng.choice([0, rng.randint(1, 30)])
        height, width = 2 * rng.randint(1, 6), 2 * rng.randint(1, 6)
        features.append(_image(len(tokens), height, width))
        tokens += [IMAGE] * (height * width // 4)
    tokens += [1] * rng.choice([0, rng.randint(1, 10)])
    return tokens or [1], features


def test_vllms_function_is_replaced_and_kept() -> None:
    from vllm.model_executor.models.qwen3_vl import Qwen3VLForConditionalGeneration

    assert mrope.install()
    assert Qwen3VLForConditionalGeneration._get_mrope_input_positions is mrope.image_positions
    assert mrope._original is not None and mrope._original is not mrope.image_positions


def test_positions_and_delta_equal_vllms_on_random_image_prompts() -> None:
    mrope.install()
    rng = random.Random(0)
    for case in range(300):
        tokens, features = _prompt(rng)
        rng.shuffle(features)  # both sort the features by offset
        expected, expected_delta = mrope._original(tokens, features, CONFIG)
        positions, delta = mrope.image_positions(tokens, features, CONFIG)
        assert positions.dtype == expected.dtype == torch.int64
        assert torch.equal(positions, expected), case
        assert delta == expected_delta, case


def test_a_prompt_with_a_video_is_left_to_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    mrope.install()
    seen = []
    monkeypatch.setattr(mrope, "_original", lambda *args: seen.append(args) or (torch.zeros(3, 1), 0))
    video = SimpleNamespace(modality="video", mm_position=SimpleNamespace(offset=0), data={})
    mrope.image_positions([1], [_image(0, 2, 2), video], CONFIG)
    assert len(seen) == 1
