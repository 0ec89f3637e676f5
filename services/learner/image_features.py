"""The frozen vision tower's outputs, computed once per distinct frame.

With LoRA on the language model only (the default `lora.target_modules`), the vision tower (and its
mergers) never changes during a run: what it makes of a frame depends on the frame's bytes alone.
The episodes of a group start on the same frame and mostly walk the same corridors, and a maze shows
one frame per cell the agent can stand on, so a step of 8 mazes x 8 episodes (about 900 images)
holds about 100 distinct frames. `ImageFeatureCache.attach` runs the tower once, without gradients,
on the frames of a step that it has not seen, and hands every micro-batch the outputs of its images; the
model's forward takes them in place of pixels (`mm_encoder_outputs`, PolicyBatch.model_inputs).

The outputs are the ones `get_image_features` returns for the images of a micro-batch: per image,
the merged embeddings and one tensor per deepstack layer. Vision attention runs within an image,
so an image's outputs do not depend on which images share its call (float round-off aside).

Used only where it is exact and safe (`usable`): no trainable weight in the vision tower, and a
model that is not FSDP-sharded (the vision blocks of a sharded model gather their weights with a
collective, which every rank would have to call together, while each rank sees other frames).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from services.common.lru import SizedLRU
from services.common.storage import is_vision_module
from services.learner.batch import PolicyBatch

# A tower call on many images at once stays within this many patches (bounded activation memory).
_MAX_PATCHES_PER_CALL = 32768


def vision_trains(model: Any) -> bool:
    """True if any trainable parameter belongs to the vision tower or its mergers (LoRA targets that
    select them, or any other way of training them): their outputs then change with every update."""
    return any(
        param.requires_grad and is_vision_module(name)
        for name, param in model.named_parameters()
    )


def usable(model: Any, sharded: bool) -> bool:
    """Whether the model's image features may be cached: a frozen vision tower that
    `get_image_features` reaches, on a model that is not sharded."""
    return not sharded and hasattr(model, "get_image_features") and not vision_trains(model)


class ImageFeatureCache:
    """Per frame digest, the vision tower's outputs (tensors on the model's device), least recently
    used first out once they take more than `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self._entries: SizedLRU[bytes, tuple[torch.Tensor, ...]] = SizedLRU(max_bytes, _nbytes)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def num_bytes(self) -> int:
        return self._entries.num_bytes

    def attach(self, model: Any, batches: Sequence[PolicyBatch], device: torch.device | str) -> None:
        """Sets `image_features` on every batch whose images all carry a digest; the tower runs
        once on the distinct frames among them that the cache does not hold."""
        keyed = [
            b for b in batches if b.image_grid_thw is not None and len(b.image_keys) == len(b.image_grid_thw)
        ]
        step: dict[bytes, tuple[torch.Tensor, ...]] = {}  # this call's features, safe from eviction
        missing: dict[bytes, tuple[PolicyBatch, int]] = {}
        for batch in keyed:
            for index, key in enumerate(batch.image_keys):
                if key in step or key in missing:
                    continue
                hit = self._entries.get(key)
                if hit is None:
                    missing[key] = (batch, index)
                else:
                    step[key] = hit
        self.hits += len(step)
        self.misses += len(missing)
        step.update(self._encode(model, missing, device))
        for batch in keyed:
            features = [step[key] for key in batch.image_keys]
            batch.image_features = _outputs(features)

    def _encode(
        self, model: Any, missing: dict[bytes, tuple[PolicyBatch, int]], device: torch.device | str
    ) -> dict[bytes, tuple[torch.Tensor, ...]]:
        """Runs the tower on the missing frames, in calls of at most `_MAX_PATCHES_PER_CALL`
        patches, and stores what it returns."""
        encoded: dict[bytes, tuple[torch.Tensor, ...]] = {}
        chunk: list[tuple[bytes, torch.Tensor, torch.Tensor]] = []
        patches = 0
        for key, (batch, index) in missing.items():
            pixels, grid = _image(batch, index)
            if chunk and patches + len(pixels) > _MAX_PATCHES_PER_CALL:
                encoded.update(self._encode_chunk(model, chunk, device))
                chunk, patches = [], 0
            chunk.append((key, pixels, grid))
            patches += len(pixels)
        if chunk:
            encoded.update(self._encode_chunk(model, chunk, device))
        return encoded

    def _encode_chunk(
        self, model: Any, chunk: list[tuple[bytes, torch.Tensor, torch.Tensor]], device: torch.device | str
    ) -> dict[bytes, tuple[torch.Tensor, ...]]:
        pixels = torch.cat([p for _, p, _ in chunk]).to(device)
        grids = torch.stack([g for _, _, g in chunk]).to(device)
        with torch.no_grad():
            out = model.get_image_features(pixels, grids, return_dict=True)
        per_layer = [out.pooler_output, *(out.deepstack_features or [])]  # each: one tensor per image
        encoded = {}
        for i, (key, _, _) in enumerate(chunk):
            features = tuple(layer[i].detach().clone() for layer in per_layer)  # not views: exact bytes
            encoded[key] = features
            self._entries.put(key, features)
        return encoded


def _nbytes(features: tuple[torch.Tensor, ...]) -> int:
    return sum(t.numel() * t.element_size() for t in features)


def _image(batch: PolicyBatch, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Image `index` of a micro-batch: (its pixel rows, its grid [3])."""
    assert batch.pixel_values is not None and batch.image_grid_thw is not None
    sizes = batch.image_grid_thw.prod(-1)
    start = int(sizes[:index].sum())
    return batch.pixel_values[start : start + int(sizes[index])], batch.image_grid_thw[index]


@dataclass(frozen=True)
class VisionOutputs:
    """Per image, what the Qwen3-VL forward reads from `get_image_features`' result."""

    pooler_output: tuple[torch.Tensor, ...]  # the merged embeddings
    deepstack_features: list[tuple[torch.Tensor, ...]]  # per deepstack layer


def _outputs(features: list[tuple[torch.Tensor, ...]]) -> VisionOutputs:
    layers = list(zip(*features, strict=True))
    return VisionOutputs(pooler_output=layers[0], deepstack_features=[tuple(layer) for layer in layers[1:]])
