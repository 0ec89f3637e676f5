"""The decoded-image cache: an image per distinct encoded bytes, named by their digest, within a budget."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from mmrl.models.tiny_adapter import frame_png
from services.rollout.frames import FrameCache

PIXEL_BYTES = 80 * 80 * 3  # one decoded tiny frame


def _pixels(image: Image.Image) -> bytes:
    return image.tobytes()


def test_equal_bytes_decode_once_to_the_image_a_plain_decode_gives() -> None:
    cache = FrameCache(2**20)
    first, again = cache.decode(frame_png(0)), cache.decode(frame_png(0))
    assert again.image is first.image and again.digest == first.digest
    assert (cache.hits, cache.misses, len(cache), cache.num_bytes) == (1, 1, 1, PIXEL_BYTES)
    with Image.open(io.BytesIO(frame_png(0))) as plain:
        assert _pixels(first.image) == _pixels(plain.convert("RGB")) and first.image.mode == "RGB"


def test_different_bytes_have_different_digests_and_images() -> None:
    cache = FrameCache(2**20)
    frames = [cache.decode(frame_png(seed)) for seed in range(4)]
    assert len({f.digest for f in frames}) == 4 and all(f.digest.startswith("blake2b-") for f in frames)
    assert len({_pixels(f.image) for f in frames}) == 4
    assert FrameCache(0).decode(frame_png(2)).digest == frames[2].digest  # the bytes' digest, not the cache's


def test_the_least_recently_used_image_leaves_when_the_budget_is_full() -> None:
    cache = FrameCache(2 * PIXEL_BYTES)
    cache.decode(frame_png(0))
    cache.decode(frame_png(1))
    cache.decode(frame_png(0))  # 0 is now the most recently used
    cache.decode(frame_png(2))  # evicts 1
    assert (len(cache), cache.num_bytes) == (2, 2 * PIXEL_BYTES)
    misses = cache.misses
    cache.decode(frame_png(0))
    assert cache.misses == misses
    cache.decode(frame_png(1))
    assert cache.misses == misses + 1


def test_a_budget_of_zero_keeps_nothing_and_bad_bytes_are_not_kept() -> None:
    cache = FrameCache(0)
    cache.decode(frame_png(0))
    cache.decode(frame_png(0))
    assert (cache.hits, cache.misses, len(cache), cache.num_bytes) == (0, 2, 0, 0)
    cache = FrameCache(2**20)
    with pytest.raises(Exception, match="cannot identify image"):
        cache.decode(b"\x89PNG not really")
    assert len(cache) == 0
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        FrameCache(-1)
