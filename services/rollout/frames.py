"""Decoded images by their encoded bytes' digest.

Each turn of an episode sends the whole conversation so far, so the turn-t request of an episode
carries all t of its frames again: over a 20-turn episode the service receives 210 images of which 20
are new. `FrameCache.decode` digests the bytes (about 1 us for an 80x80 PNG) and decodes only bytes
it has not seen (about 140 us), keeping decoded images up to a byte budget, least recently used out
first. The digest also names the image to vLLM (`multi_modal_uuids`), which then skips hashing the
decoded pixels (about 90 us per image), the key of its processor cache and of the prefix cache's
image blocks. Equal bytes decode to equal pixels, so one digest is one image; equal pixels sent as
different bytes only cost a second decode and a second cache entry.

A working set larger than the budget (64 episodes' frames of a larger model's images, say) is
visited in the same order every turn, which least-recently-used eviction serves badly: then most
frames are decoded again, as without a cache, and the digest is what remains of the saving.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass

from PIL import Image

from services.common.lru import SizedLRU


@dataclass(frozen=True)
class Frame:
    digest: str  # of the encoded bytes: "blake2b-" and 32 hex digits
    image: Image.Image  # RGB; shared by every request that sent these bytes, so never modified


class FrameCache:
    """Decoded RGB images keyed by their encoded bytes' digest, at most `max_bytes` of pixels."""

    def __init__(self, max_bytes: int) -> None:
        self._images: SizedLRU[str, Image.Image] = SizedLRU(max_bytes, _pixel_bytes)
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._images)

    @property
    def num_bytes(self) -> int:
        return self._images.num_bytes

    def decode(self, data: bytes) -> Frame:
        """The image `data` encodes; raises what PIL raises for data it cannot decode (not cached)."""
        digest = "blake2b-" + hashlib.blake2b(data, digest_size=16).hexdigest()
        image = self._images.get(digest)
        if image is not None:
            self.hits += 1
            return Frame(digest, image)
        self.misses += 1
        with Image.open(io.BytesIO(data)) as opened:
            image = opened.convert("RGB")
        self._images.put(digest, image)
        return Frame(digest, image)


def _pixel_bytes(image: Image.Image) -> int:
    return image.width * image.height * len(image.getbands())
