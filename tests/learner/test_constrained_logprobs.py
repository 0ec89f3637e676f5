"""The learner's side of constrained actions: a trajectory's generated tokens must be ones the mask
allows where they stand, and log-probs and entropies are those of the distribution renormalised over
the allowed tokens (checked against a softmax over them by hand)."""

from __future__ import annotations

import pytest
import torch

from services.common.constrained import ActionMask
from services.common.trajectory import Trajectory
from services.learner.batch import ModelSpec, prepare_trajectory
from services.learner.policy import _constrained_logprobs

END = 2
MASK = ActionMask(((10, END), (12, 13, END)))
SPEC = ModelSpec(vocab_size=32, image_token_id=31, merge_size=2, pad_token_id=0)


def _trajectory(tokens: tuple[int, ...], mask: tuple[int, ...]) -> Trajectory:
    return Trajectory("t", tokens, mask, tuple(-0.5 * m for m in mask), tuple(float(m) for m in mask))


def test_each_generated_position_carries_the_tokens_the_mask_allows_there() -> None:
    prepared = prepare_trajectory(_trajectory((5, 12, 13, END, 6, 10, END), (0, 1, 1, 1, 0, 1, 1)), SPEC, None, MASK)
    assert prepared.allowed is not None
    rows = [tuple(t for t in row.tolist() if t >= 0) for row in prepared.allowed]
    assert rows == [(5,), (10, 12), (13,), (END,), (6,), (10, 12), (END,)]


def test_a_token_the_mask_does_not_allow_is_refused_naming_the_trajectory() -> None:
    with pytest.raises(ValueError, match="trajectory 't': generated token 11 at position 1 is not one"):
        prepare_trajectory(_trajectory((5, 11, END), (0, 1, 1)), SPEC, None, MASK)


def test_log_probs_and_entropy_are_those_of_the_softmax_over_the_allowed_tokens() -> None:
    logits = torch.randn(1, 2, 32)
    allowed = torch.tensor([[[10, 12], [13, -1]]])
    targets = torch.tensor([[12, 13]])
    logprobs, entropy = _constrained_logprobs(logits, targets, allowed, with_entropy=True)
    over = torch.log_softmax(logits[0, 0, [10, 12]], dim=-1)
    assert logprobs[0, 0].item() == pytest.approx(over[1].item(), abs=1e-6)
    assert logprobs[0, 1].item() == pytest.approx(0.0, abs=1e-6)  # one allowed token: certain
    assert entropy is not None and entropy[0, 0].item() == pytest.approx(-(over.exp() * over).sum().item(), abs=1e-6)
    assert entropy[0, 1].item() == pytest.approx(0.0, abs=1e-6)


def test_the_entropy_over_the_allowed_tokens_carries_a_gradient_to_them_only_when_asked() -> None:
    logits = torch.randn(1, 2, 32, requires_grad=True)
    allowed = torch.tensor([[[10, 12], [13, -1]]])
    targets = torch.tensor([[12, 13]])
    _, detached = _constrained_logprobs(logits, targets, allowed, with_entropy=True)
    _, entropy = _constrained_logprobs(logits, targets, allowed, with_entropy=True, entropy_grad=True)
    assert detached is not None and not detached.requires_grad
    assert entropy is not None and torch.allclose(entropy, detached)
    entropy.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    moved = logits.grad.abs().sum(-1) > 0
    assert moved.tolist() == [[True, False]]  # one allowed token: its entropy is 0 whatever the logits
    assert logits.grad[0, 0].nonzero().flatten().tolist() == [10, 12]
