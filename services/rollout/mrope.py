"""Qwen3-VL's M-RoPE positions of a new request in one pass over preallocated arrays, installed in
the engine's worker process.

vLLM computes the 3-row (time, height, width) positions of a request's whole prompt when the request
arrives (`GPUModelRunner._init_mrope_positions`, on every backend). Its Qwen3-VL version builds a
list of small numpy arrays per image (a text run, the image's grid, a `.max()` of the last one for the
next start) and concatenates them. An episode's turn t is a new request whose prompt holds all t frames,
so a 20-turn episode pays for 1 + 2 + ... + 20 frames; in GRPO on the tiny model that was 4.9% of the
engine core's time, and 0.9% in one pass (services/rollout/README.md).

`image_positions` computes the same positions with one slice assignment per text run and per image
(each image's grid is built once per size and kept), and the next start from the grid's size instead
of a `.max()`. It handles prompts whose features are all images; anything else (video) is passed to
vLLM's own function. tests/rollout/test_mrope.py checks equality with vLLM's function on random prompts.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

import numpy as np
import torch

log = logging.getLogger("mmrl.rollout.mrope")

_original: Any = None  # vLLM's Qwen3VLForConditionalGeneration._get_mrope_input_positions, once installed


@cache
def _grid(height: int, width: int) -> np.ndarray:
    """(3, height * width) positions of an image's merged grid relative to its start: time 0, row, column."""
    grid = np.indices((1, height, width)).reshape(3, -1)
    grid.setflags(write=False)
    return grid


def image_positions(input_tokens: list[int], mm_features: list[Any], config: Any) -> tuple[torch.Tensor, int]:
    """(positions [3, len(input_tokens)], delta): what vLLM's Qwen3-VL `_get_mrope_input_positions`
    returns for a prompt whose features are all images. Text tokens advance all three rows together;
    an image's tokens take its grid's (0, row, column) from the current start; the next start is one
    past the largest position so far. delta = that next start minus the prompt's length."""
    if any(feature.modality != "image" for feature in mm_features):
        return _original(input_tokens, mm_features, config)  # type: ignore[no-any-return]
    merge = config.vision_config.spatial_merge_size
    length = len(input_tokens)
    positions = np.empty((3, length), dtype=np.int64)
    token = 0  # the next token to place
    start = 0  # its position
    for feature in sorted(mm_features, key=lambda f: f.mm_position.offset):
        offset = feature.mm_position.offset
        frames, height, width = feature.data["image_grid_thw"].data.tolist()
        assert frames == 1, f"an image has 1 frame, got {frames}"
        height, width = height // merge, width // merge
        text = offset - token
        positions[:, token:offset] = np.arange(start, start + text)
        start += text
        size = height * width
        positions[:, offset:offset + size] = _grid(height, width) + start
        start += max(height, width)
        token = offset + size
    positions[:, token:] = np.arange(start, start + length - token)
    start += length - token
    return torch.from_numpy(positions), start - length


def install() -> bool:
    """Makes Qwen3-VL (and models built on it) use `image_positions`; True if vLLM was patched."""
    global _original
    try:
        from vllm.model_executor.models.qwen3_vl import Qwen3VLForConditionalGeneration
    except ImportError:  # a vLLM without Qwen3-VL: nothing to patch
        return False
    if _original is None:
        _original = Qwen3VLForConditionalGeneration._get_mrope_input_positions
        Qwen3VLForConditionalGeneration._get_mrope_input_positions = staticmethod(  # type: ignore[method-assign]
            image_positions)
        log.info("one-pass M-RoPE positions installed")
    return True


class MropeWorkerExtension:
    """vLLM worker extension whose only job is to import this module (and so patch) in the worker."""

    def mmrl_mrope_installed(self) -> bool:
        return install()


install()
