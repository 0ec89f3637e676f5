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


def _punica_wrapper(indices: list[int], prefill: bool) -> object:
    """vLLM's CPU punica wrapper with the token-to-slot mapping of one batch."""
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    wrapper = PunicaWrapperCPU(64, 8, "cpu")
    wrapper._token_lora_indices[: len(indices)].copy_(torch.tensor(indices))
    wrapper.indices_len[0] = len(indices)
    wrapper.is_prefill = prefill
    if prefill:
        wrapper._update_prefill_metadata(wrapper.token_lora_indices)
    return wrapper


SLICES = (16, 8, 8)  # a merged projection's output slices, like q, k and v


def _merged_projection_weights() -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    a = tuple(_weights(10 + i, RANK, HIDDEN) for i in range(len(SLICES)))
    b = tuple(_weights(20 + i, width, RANK) for i, width in enumerate(SLICES))
    return a, b


@pytest.mark.parametrize("prefill", [True, False])
@pytest.mark.parametrize("indices", [[1] * 7, [0, 0, 2, 2, 2, 1, 0], [-1, -1, 2, 2, -1, 0, 0], [-1] * 7])
def test_add_lora_linear_equals_vllms_method_for_one_adapter_and_for_mixed_batches(
        indices: list[int], prefill: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch on one slot (or none) takes the one-matmul way, without calling vLLM's method; a batch
    mixing slots goes to vLLM's method. Either way `y` ends as vLLM's method leaves it."""
    assert cpu_lora.install() and cpu_lora._vllm_add_lora_linear is not None
    wrapper = _punica_wrapper(indices, prefill)
    x, (a, b) = torch.randn(7, HIDDEN), _merged_projection_weights()
    y = torch.randn(7, sum(SLICES))
    before, expected = y.clone(), y.clone()
    cpu_lora._vllm_add_lora_linear(wrapper, expected, x, a, b, 0.5, SLICES)
    if len(set(indices)) == 1:
        def refuse(*args: object, **kwargs: object) -> None:
            raise AssertionError("a batch on one slot went to vLLM's add_lora_linear")

        monkeypatch.setattr(cpu_lora, "_vllm_add_lora_linear", refuse)
    cpu_lora.add_lora_linear(wrapper, y, x, a, b, 0.5, SLICES)
    torch.testing.assert_close(y, expected)
    adapted = torch.tensor(indices) >= 0  # rows with an adapter changed; the others did not
    assert not torch.isclose(y, before)[adapted].any()
    assert torch.equal(y[~adapted], before[~adapted])


def test_installing_replaces_add_lora_linear_once() -> None:
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    assert cpu_lora.install() and cpu_lora.install()
    assert PunicaWrapperCPU.add_lora_linear is cpu_lora.add_lora_linear
    assert cpu_lora._vllm_add_lora_linear is not cpu_lora.add_lora_linear
