"""The grouped CPU LoRA ops compute what vLLM's reference ops compute, without per-token weight copies,
and leave tokens without an adapter (slot -1) alone."""

from __future__ import annotations

import pytest
import torch
from vllm.lora.ops.torch_ops import lora_ops as reference

from services.rollout import cpu_lora

NUM_SLOTS, RANK, HIDDEN, OUT = 3, 8, 32, 48


def _weights(seed: int, rows: int, cols: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(NUM_SLOTS, 1, rows, cols, generator=generator)


def _loop_shrink(x: torch.Tensor, a: torch.Tensor, idx: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.stack([scale * x[t] @ a[i, 0].T if i >= 0 else torch.zeros(a.shape[2])
                        for t, i in enumerate(idx.tolist())])


@pytest.mark.parametrize("indices", [[1] * 7, [0, 0, 2, 2, 2, 1, 0], [-1, -1, 2, 2, -1, 0, 0], [-1] * 7])
def test_grouped_shrink_matches_a_per_token_loop(indices: list[int]) -> None:
    x, a, idx = torch.randn(7, HIDDEN), _weights(0, RANK, HIDDEN), torch.tensor(indices)
    out = torch.full((7, RANK), 5.0)
    cpu_lora.bgmv_shrink(x, a, out, idx, 0.5)
    torch.testing.assert_close(out, _loop_shrink(x, a, idx, 0.5))


@pytest.mark.parametrize("indices", [[1] * 7, [0, 0, 2, 2, 2, 1, 0], [-1, -1, 2, 2, -1, 0, 0]])
def test_grouped_expand_slice_adds_only_to_tokens_with_an_adapter(indices: list[int]) -> None:
    x, b, idx = torch.randn(7, RANK), _weights(1, OUT // 2, RANK), torch.tensor(indices)
    y = torch.randn(7, OUT)
    expected = y.clone()
    for t, i in enumerate(indices):
        if i >= 0:
            expected[t, 8: 8 + OUT // 2] += x[t] @ b[i, 0].T
    cpu_lora.bgmv_expand_slice(x, b, y, idx, 8, OUT // 2, add_inputs=True)
    torch.testing.assert_close(y, expected)


def test_grouped_ops_equal_vllm_reference_ops_when_every_token_has_an_adapter() -> None:
    x, a, b = torch.randn(9, HIDDEN), _weights(2, RANK, HIDDEN), _weights(3, OUT, RANK)
    seq_lens, slots = torch.tensor([4, 5]), torch.tensor([2, 0])
    meta = (torch.tensor([0, 4]), seq_lens, slots, 2, 5, 9)
    ours, theirs = torch.zeros(9, RANK), torch.zeros(9, RANK)
    cpu_lora.sgmv_shrink(x, a, ours, *meta, 0.25)
    reference.sgmv_shrink(x, a, theirs, *meta, 0.25)
    torch.testing.assert_close(ours, theirs)
    y_ours, y_theirs = torch.randn(9, OUT), None
    y_theirs = y_ours.clone()
    cpu_lora.sgmv_expand(ours, b, y_ours, *meta, add_inputs=True)
    reference.sgmv_expand(theirs, b, y_theirs, *meta, add_inputs=True)
    torch.testing.assert_close(y_ours, y_theirs)


def test_vllm_reference_ops_apply_the_last_slot_to_tokens_without_an_adapter() -> None:
    """Why the grouped ops skip slot -1: the reference ops index it as the last slot, so in a batch
    mixing base-model and adapter requests the base requests get the last slot's adapter."""
    x, a = torch.randn(2, HIDDEN), _weights(4, RANK, HIDDEN)
    out = torch.zeros(2, RANK)
    reference.bgmv_shrink(x, a, out, torch.tensor([-1, 0]), 1.0)
    torch.testing.assert_close(out[0], x[0] @ a[NUM_SLOTS - 1, 0].T)


def test_installing_patches_the_cpu_punica_wrapper() -> None:
    from vllm.lora.punica_wrapper import punica_cpu

    assert cpu_lora.install()
    assert punica_cpu.sgmv_shrink is cpu_lora.sgmv_shrink
    assert punica_cpu.bgmv_expand_slice is cpu_lora.bgmv_expand_slice
