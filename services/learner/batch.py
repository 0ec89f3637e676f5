"""Trajectories -> validated, padded model inputs (reusable by SFT and the log-prob checks).

`prepare_trajectory` checks one trajectory against the model (lengths, vocabulary, images that
decode, one placeholder run per image of exactly the processor's token count) and runs the same HF
image processor the rollout engine ran on the same frame bytes (`FrameProcessor`). `collate` pads
a list of prepared trajectories into a `PolicyBatch`, running each distinct token-and-image sequence
through the model once (a windowed episode's turns from the same frame, or a group's episodes that
played the same moves, are one row of the model's inputs). Errors are ValueError naming the
trajectory.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image

from services.common.constrained import ActionMask, generated_prefixes
from services.common.trajectory import Trajectory


@dataclass(frozen=True)
class ModelSpec:
    """What batch building needs to know about the model, read from its config."""

    vocab_size: int
    image_token_id: int
    merge_size: int
    pad_token_id: int

    @classmethod
    def from_config(cls, config: Any) -> ModelSpec:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        pad = getattr(text, "pad_token_id", None)
        if pad is None:
            pad = getattr(config, "pad_token_id", None)
        return cls(
            vocab_size=int(text.vocab_size),
            image_token_id=int(config.image_token_id),
            merge_size=int(config.vision_config.spatial_merge_size),
            pad_token_id=int(pad) if pad is not None else 0,
        )


@dataclass(frozen=True)
class PreparedTrajectory:
    """One trajectory as tensors, validated. `weight` 0 marks a padding copy that only keeps ranks
    in step (it runs forward/backward but contributes nothing)."""

    trajectory_id: str
    input_ids: torch.Tensor  # [T] long
    loss_mask: torch.Tensor  # [T] float
    rollout_logprobs: torch.Tensor  # [T] float
    advantages: torch.Tensor  # [T] float
    pixel_values: torch.Tensor | None  # [num_patches, patch_dim]
    image_grid_thw: torch.Tensor | None  # [num_images, 3] long
    weight: float = 1.0
    share: float = 1.0  # the trajectory's part of its episode: 1 / segments (sequence_mean's weight)
    image_keys: tuple[bytes, ...] = ()  # one content digest per image (`FrameProcessor.keyed`)
    allowed: torch.Tensor | None = None  # [T, A] long: constrained actions' allowed tokens per position, -1 pad

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_generated(self) -> int:
        return int(self.loss_mask.sum().item())

    def as_padding(self) -> PreparedTrajectory:
        return PreparedTrajectory(**{**self.__dict__, "weight": 0.0})

    @property
    def sequence_key(self) -> tuple[bytes, ...]:
        """Equal for trajectories the model sees as the same input (token ids, images, allowed
        tokens): their log-probs are one forward's. Advantages, masks and weights are not part of it."""
        images = self.image_keys
        num_images = 0 if self.image_grid_thw is None else len(self.image_grid_thw)
        if self.pixel_values is not None and len(images) != num_images:
            images = (self.pixel_values.numpy().tobytes(),)  # frames without digests: their pixels
        allowed = b"" if self.allowed is None else self.allowed.numpy().tobytes()
        return (self.input_ids.numpy().tobytes(), *images, allowed)


@dataclass
class PolicyBatch:
    """Padded model inputs of a micro-batch and the per-token training data at its scored positions.

    `target_cols` [K] are the columns holding a generated token in at least one row; the token at
    column c is scored by the logits at c - 1. Per-token tensors are [B, K] gathered at them.

    The model's inputs (`input_ids`, `attention_mask`, `mm_token_type_ids`, the images, `allowed`)
    hold the U <= B distinct sequences of the micro-batch, [U, ...]; trajectory b reads row
    `rows[b]` of them. Everything else is per trajectory, [B] or [B, K].
    """

    trajectory_ids: list[str]
    input_ids: torch.Tensor  # [U, T] long, right-padded
    attention_mask: torch.Tensor  # [U, T] long
    mm_token_type_ids: torch.Tensor  # [U, T] int: 1 at image placeholder tokens
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None
    target_cols: torch.Tensor  # [K] long
    loss_mask: torch.Tensor  # [B, K] float
    rollout_logprobs: torch.Tensor  # [B, K] float
    advantages: torch.Tensor  # [B, K] float
    weights: torch.Tensor  # [B] float: 1 for real trajectories, 0 for padding copies
    shares: torch.Tensor | None = None  # [B] float: each trajectory's part of its episode (1 / segments)
    image_keys: list[bytes] = field(default_factory=list)  # one content digest per image, in order
    allowed: torch.Tensor | None = None  # [U, K, A] long: the tokens a constrained action allowed there, -1 pad
    image_features: Any = None  # the vision tower's outputs for these images (services/learner/image_features.py)
    rows: torch.Tensor | None = None  # [B] long: the model-input row each trajectory reads; None: row b

    def model_inputs(self, device: torch.device | str) -> dict[str, Any]:
        """Keyword arguments of the HF model's forward (no labels, no cache): the images as pixels,
        or as the vision tower's outputs where `image_features` holds them.

        No attention mask: rows are right-padded and attention is causal, so no real token attends
        to a pad, and a pad's outputs are never scored. Without a mask, SDPA runs its causal
        kernel, which skips the blocks above the diagonal; a padded row would otherwise make the
        model build an explicit mask, and every block of it is computed (about 12% of the forward and
        backward of a GRPO-shaped batch on the tiny model, with the same log-probs to the bit;
        docs/learner.md)."""
        inputs: dict[str, Any] = {
            "input_ids": self.input_ids.to(device),
            "mm_token_type_ids": self.mm_token_type_ids.to(device),
        }
        if self.pixel_values is not None:
            inputs["image_grid_thw"] = self.image_grid_thw.to(device)  # type: ignore[union-attr]
            if self.image_features is not None:
                inputs["mm_encoder_outputs"] = {"image": self.image_features}
            else:
                inputs["pixel_values"] = self.pixel_values.to(device)
        return inputs

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum().item())


def image_token_runs(token_ids: Sequence[int], image_token_id: int) -> list[tuple[int, int]]:
    """(start, length) of each maximal run of `image_token_id`, in order."""
    runs: list[tuple[int, int]] = []
    start = None
    for i, token in enumerate(token_ids):
        if token == image_token_id and start is None:
            start = i
        elif token != image_token_id and start is not None:
            runs.append((start, i - start))
            start = None
    if start is not None:
        runs.append((start, len(token_ids) - start))
    return runs


def decode_image(data: bytes) -> Image.Image:
    """Decodes encoded frame bytes to an RGB image exactly as the rollout service does before its
    engine sees them (PIL, `convert("RGB")`: alpha is dropped, not composited); ValueError if they
    are not an image."""
    try:
        with Image.open(io.BytesIO(data)) as opened:
            return opened.convert("RGB")
    except Exception as exc:  # PIL raises several unrelated types for corrupt data
        raise ValueError(f"does not decode ({type(exc).__name__}: {exc})") from exc


class FrameProcessor:
    """The model's HF image processor applied frame by frame, with results cached by content (the
    episodes of a GRPO group share frames). Each image is processed on its own, which gives the
    same tensors as processing a trajectory's images together."""

    def __init__(self, image_processor: Any, max_cached: int = 8192) -> None:
        self.image_processor = image_processor
        self.max_cached = max_cached
        self._cache: OrderedDict[bytes, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()

    def __call__(self, frames: Sequence[bytes]) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixel_values [patches, dim], image_grid_thw [len(frames), 3]); ValueError naming the
        index of a frame that does not decode."""
        pixels, grids, _ = self.keyed(frames)
        return pixels, grids

    def keyed(self, frames: Sequence[bytes]) -> tuple[torch.Tensor, torch.Tensor, tuple[bytes, ...]]:
        """`self(frames)` and the content digest of each frame."""
        pixels, grids, keys = [], [], []
        for index, data in enumerate(frames):
            key = hashlib.blake2b(data, digest_size=16).digest()
            keys.append(key)
            hit = self._cache.get(key)
            if hit is None:
                try:
                    image = decode_image(data)
                except ValueError as exc:
                    raise ValueError(f"image {index} {exc}") from exc
                out = self.image_processor(images=[image], return_tensors="pt")
                hit = (out["pixel_values"], out["image_grid_thw"].long())
                self._cache[key] = hit
                if len(self._cache) > self.max_cached:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
            pixels.append(hit[0])
            grids.append(hit[1])
        return torch.cat(pixels), torch.cat(grids), tuple(keys)


def _frame_processor(frames: FrameProcessor | Any) -> FrameProcessor:
    return frames if isinstance(frames, FrameProcessor) else FrameProcessor(frames)


def prepare_trajectory(traj: Trajectory, spec: ModelSpec, frames: FrameProcessor | Any,
                       mask: ActionMask | None = None) -> PreparedTrajectory:
    """Validates `traj` against the model and turns it into tensors; raises ValueError naming it.
    `frames` is a FrameProcessor or the model's HF image processor. With `mask` (constrained actions)
    every generated token must be one the mask allows where it stands, and the allowed tokens of each
    position come along."""
    frames = _frame_processor(frames)
    name = f"trajectory {traj.trajectory_id!r}"
    traj.validate()
    ids = traj.token_ids
    bad = [t for t in ids if not 0 <= t < spec.vocab_size]
    if bad:
        raise ValueError(f"{name}: token id {bad[0]} outside the vocabulary [0, {spec.vocab_size})")
    if traj.loss_mask[0]:
        raise ValueError(f"{name}: the first token cannot be generated (loss_mask[0] must be 0)")
    if traj.num_generated_tokens == 0:
        raise ValueError(f"{name}: no generated tokens (loss_mask is all 0)")
    for label in ("logprobs", "advantages"):
        values = getattr(traj, label)
        if any(not math.isfinite(v) for v, m in zip(values, traj.loss_mask, strict=True) if m):
            raise ValueError(f"{name}: {label} are not finite on generated tokens")
    runs = image_token_runs(ids, spec.image_token_id)
    if any(traj.loss_mask[s + k] for s, n in runs for k in range(n)):
        raise ValueError(f"{name}: loss_mask is 1 on image placeholder tokens")
    if len(runs) != len(traj.images):
        raise ValueError(f"{name}: {len(runs)} image placeholder runs but {len(traj.images)} images")
    pixel_values = grid = None
    keys: tuple[bytes, ...] = ()
    if traj.images:
        try:
            pixel_values, grid, keys = frames.keyed(traj.images)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from exc
        for index, ((_, length), thw) in enumerate(zip(runs, grid.tolist(), strict=True)):
            expected = math.prod(thw) // spec.merge_size**2
            if length != expected:
                raise ValueError(
                    f"{name}: image {index} has a placeholder run of {length} tokens but the processor "
                    f"makes {expected} (grid {thw}); send the engine-expanded token ids"
                )
    return PreparedTrajectory(
        allowed=None if mask is None else _allowed_tokens(traj, mask, name),
        trajectory_id=traj.trajectory_id,
        input_ids=torch.tensor(ids, dtype=torch.long),
        loss_mask=torch.tensor(traj.loss_mask, dtype=torch.float32),
        rollout_logprobs=_on_generated(traj.logprobs, traj.loss_mask),
        advantages=_on_generated(traj.advantages, traj.loss_mask),
        pixel_values=pixel_values,
        image_grid_thw=grid,
        image_keys=keys,
        share=1.0 / traj.segments,
    )


def _allowed_tokens(traj: Trajectory, mask: ActionMask, name: str) -> torch.Tensor:
    """[T, A]: at each generated position the tokens `mask` allows there (-1 pad), elsewhere the token itself
    (its log-prob is then 0 and never trained on)."""
    rows: list[tuple[int, ...]] = []
    for position, (token, prefix) in enumerate(zip(traj.token_ids, generated_prefixes(traj.token_ids, traj.loss_mask),
                                                   strict=True)):
        if prefix is None:
            rows.append((token,))
            continue
        allowed = mask.allowed(prefix)
        if token not in allowed:
            raise ValueError(f"{name}: generated token {token} at position {position} is not one the constrained "
                             f"actions allow there ({list(allowed)})")
        rows.append(allowed)
    out = torch.full((len(rows), max(len(r) for r in rows)), -1, dtype=torch.long)
    for position, row in enumerate(rows):
        out[position, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def _on_generated(values: Sequence[float], loss_mask: Sequence[int]) -> torch.Tensor:
    """`values` where the loss mask is 1, else 0: values the contract leaves free (NaN, inf) on
    positions not trained on must not reach the loss, where 0 x NaN would still be NaN."""
    return torch.tensor([v if m else 0.0 for v, m in zip(values, loss_mask, strict=True)], dtype=torch.float32)


def prepare_batch(
    trajectories: Sequence[Trajectory], spec: ModelSpec, frames: FrameProcessor | Any, mask: ActionMask | None = None
) -> list[PreparedTrajectory]:
    """`prepare_trajectory` on each; errors name the trajectory's index and id. Empty -> error."""
    frames = _frame_processor(frames)
    if not trajectories:
        raise ValueError("the batch has no trajectories")
    prepared = []
    for index, traj in enumerate(trajectories):
        try:
            prepared.append(prepare_trajectory(traj, spec, frames, mask))
        except ValueError as exc:
            raise ValueError(f"trajectory #{index}: {exc}") from exc
    return prepared


def collate(items: Sequence[PreparedTrajectory], pad_token_id: int, image_token_id: int) -> PolicyBatch:
    """Right-pads prepared trajectories into one micro-batch; trajectories with the same
    `sequence_key` share one row of the model's inputs."""
    assert items, "collate needs at least one trajectory"
    row_of: dict[tuple[bytes, ...], int] = {}
    distinct: list[PreparedTrajectory] = []
    rows = []
    for item in items:
        row = row_of.setdefault(item.sequence_key, len(distinct))
        if row == len(distinct):
            distinct.append(item)
        rows.append(row)
    num_rows, width = len(distinct), max(item.num_tokens for item in items)
    input_ids = torch.full((num_rows, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((num_rows, width), dtype=torch.long)
    for row, item in enumerate(distinct):
        input_ids[row, : item.num_tokens] = item.input_ids
        attention_mask[row, : item.num_tokens] = 1
    full_mask = torch.zeros((len(items), width))
    full_logprobs = torch.zeros((len(items), width))
    full_advantages = torch.zeros((len(items), width))
    for b, item in enumerate(items):
        n = item.num_tokens
        full_mask[b, :n] = item.loss_mask
        full_logprobs[b, :n] = item.rollout_logprobs
        full_advantages[b, :n] = item.advantages
    target_cols = torch.nonzero(full_mask.any(dim=0)).squeeze(1)
    allowed = None
    if any(item.allowed is not None for item in items):
        assert all(item.allowed is not None for item in items), "a micro-batch is constrained throughout or not"
        parts = [item.allowed for item in distinct if item.allowed is not None]
        full_allowed = torch.full((num_rows, width, max(part.shape[1] for part in parts)), -1)
        full_allowed[:, :, 0] = input_ids  # padding: the token itself (log-prob 0, never trained on)
        for row, (item, part) in enumerate(zip(distinct, parts, strict=True)):
            full_allowed[row, : item.num_tokens, : part.shape[1]] = part
        allowed = full_allowed[:, target_cols]
    pixel_parts = [item.pixel_values for item in distinct if item.pixel_values is not None]
    grid_parts = [item.image_grid_thw for item in distinct if item.image_grid_thw is not None]
    return PolicyBatch(
        trajectory_ids=[item.trajectory_id for item in items],
        input_ids=input_ids,
        attention_mask=attention_mask,
        mm_token_type_ids=((input_ids == image_token_id) & attention_mask.bool()).int(),
        pixel_values=torch.cat(pixel_parts) if pixel_parts else None,
        image_grid_thw=torch.cat(grid_parts) if grid_parts else None,
        target_cols=target_cols,
        loss_mask=full_mask[:, target_cols],
        rollout_logprobs=full_logprobs[:, target_cols],
        advantages=full_advantages[:, target_cols],
        weights=torch.tensor([item.weight for item in items]),
        shares=torch.tensor([item.share for item in items]),
        image_keys=[key for item in distinct for key in item.image_keys],
        allowed=allowed,
        rows=None if num_rows == len(items) else torch.tensor(rows),
    )
