"""The GRPO/DAPO maths against hand-computed values."""

from __future__ import annotations

import json
import math

import pytest
import torch

from services.common.training import OptimSettings, TrainSettings
from services.learner.loss import (
    aggregation_weights,
    clipped_surrogate,
    kl_k3,
    policy_loss,
    truncated_is_weights,
)
from services.learner.optim import learning_rate_at


def _t(*values: float) -> torch.Tensor:
    return torch.tensor([list(values)], dtype=torch.float64)


def test_clipped_surrogate_matches_hand_computed_values_on_both_sides_of_the_clip() -> None:
    ratios = [1.5, 0.5, 1.1, 0.7, 1.5]
    advantages = _t(1.0, -1.0, 2.0, 1.0, -1.0)
    logprobs = torch.log(_t(*ratios))
    loss, clipped = clipped_surrogate(logprobs, torch.zeros_like(logprobs), advantages, 0.2, 0.28)
    # r=1.5, A=+1: min(1.5, 1.28) = 1.28 -> clipped above
    # r=0.5, A=-1: min(-0.5, -0.8) = -0.8 -> clipped below
    # r=1.1, A=+2: 2.2, inside the clip range
    # r=0.7, A=+1: min(0.7, 0.8) = 0.7: the lower clip does not bind for a positive advantage
    # r=1.5, A=-1: min(-1.5, -1.28) = -1.5: the upper clip does not bind for a negative advantage
    assert loss.tolist()[0] == pytest.approx([-1.28, 0.8, -2.2, -0.7, 1.5])
    assert clipped.tolist()[0] == [True, True, False, False, False]


def test_clip_higher_lets_a_positive_advantage_grow_further_than_the_symmetric_clip() -> None:
    logprobs = torch.log(_t(1.25))
    symmetric, clipped_sym = clipped_surrogate(logprobs, torch.zeros_like(logprobs), _t(1.0), 0.2, 0.2)
    higher, clipped_high = clipped_surrogate(logprobs, torch.zeros_like(logprobs), _t(1.0), 0.2, 0.28)
    assert symmetric.item() == pytest.approx(-1.2) and clipped_sym.item()
    assert higher.item() == pytest.approx(-1.25) and not clipped_high.item()


def test_on_policy_surrogate_has_the_policy_gradient_minus_advantage() -> None:
    logprobs = torch.log(_t(0.3, 0.6)).requires_grad_(True)
    advantages = _t(2.0, -1.0)
    loss, _ = clipped_surrogate(logprobs, logprobs.detach(), advantages, 0.2, 0.28)
    loss.sum().backward()
    assert logprobs.grad is not None
    assert logprobs.grad.tolist()[0] == pytest.approx([-2.0, 1.0])


def test_k3_is_zero_for_equal_policies_and_matches_its_formula() -> None:
    logprobs = _t(-1.0, -2.0, -0.5)
    assert kl_k3(logprobs, logprobs).abs().max().item() == 0.0
    ref = _t(-1.5, -1.0, -0.5)
    # d = ref - logp = (-0.5, 1.0, 0.0); k3 = exp(d) - d - 1
    expected = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1, 0.0]
    assert kl_k3(logprobs, ref).tolist()[0] == pytest.approx(expected)
    assert (kl_k3(logprobs, ref) >= 0).all()


def test_truncated_importance_weights_are_capped_ratios_without_gradient() -> None:
    learner = torch.log(_t(0.5, 0.2, 0.9)).requires_grad_(True)
    rollout = torch.log(_t(0.25, 0.4, 0.1))
    weights = truncated_is_weights(learner, rollout, cap=2.0)
    # ratios 2.0, 0.5, 9.0 -> capped at 2
    assert weights.tolist()[0] == pytest.approx([2.0, 0.5, 2.0])
    assert not weights.requires_grad


def test_token_mean_and_sequence_mean_weights_match_hand_computed_values() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    token = aggregation_weights(mask, "token_mean", num_tokens=4, num_sequences=2)
    assert token.tolist() == [[0.25, 0.25, 0.25, 0.0], [0.25, 0.0, 0.0, 0.0]]
    sequence = aggregation_weights(mask, "sequence_mean", num_tokens=4, num_sequences=2)
    expected = torch.tensor([[1 / 6, 1 / 6, 1 / 6, 0.0], [0.5, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(sequence, expected)


def test_sequence_mean_counts_an_episode_cut_into_one_trajectory_per_turn_once() -> None:
    # Episode A (three one-token turns) whole in row 0, episode B in row 1; then A as three rows of share 1/3.
    per_turn = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64)
    whole_mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    whole_loss = torch.tensor([[0.3, -1.2, 2.0], [0.7, 0.0, 0.0]], dtype=torch.float64)
    whole = (aggregation_weights(whole_mask, "sequence_mean", 4, 2) * whole_loss).sum()
    cut_mask = torch.ones(4, 1, dtype=torch.float64)
    cut_loss = torch.cat([per_turn, torch.tensor([0.7], dtype=torch.float64)])[:, None]
    shares = torch.tensor([1 / 3, 1 / 3, 1 / 3, 1.0])
    cut = (aggregation_weights(cut_mask, "sequence_mean", 4, float(shares.sum()), shares) * cut_loss).sum()
    torch.testing.assert_close(cut, whole)
    # Without the shares each turn would count as an episode: a different loss.
    unshared = (aggregation_weights(cut_mask, "sequence_mean", 4, 4) * cut_loss).sum()
    assert not torch.isclose(unshared, whole)


@pytest.mark.parametrize("mode", ["token_mean", "sequence_mean"])
def test_weights_from_whole_batch_counts_make_split_batches_sum_to_the_whole_batch_loss(mode: str) -> None:
    torch.manual_seed(0)
    mask = (torch.rand(6, 5) < 0.6).double()
    mask[:, 0] = 1.0
    per_token = torch.randn(6, 5, dtype=torch.float64)
    num_tokens, num_sequences = int(mask.sum()), 6
    whole = (aggregation_weights(mask, mode, num_tokens, num_sequences) * per_token).sum()  # type: ignore[arg-type]
    parts = sum(
        (aggregation_weights(mask[rows], mode, num_tokens, num_sequences) * per_token[rows]).sum()  # type: ignore[arg-type]
        for rows in (slice(0, 1), slice(1, 4), slice(4, 6))
    )
    if mode == "token_mean":
        expected = (per_token * mask).sum() / num_tokens
    else:
        expected = ((per_token * mask).sum(1) / mask.sum(1)).mean()
    assert whole.item() == pytest.approx(expected.item())
    assert parts.item() == pytest.approx(expected.item())


def test_policy_loss_adds_weighted_surrogate_and_kl() -> None:
    logprobs = torch.log(_t(0.5, 0.25))
    old = torch.log(_t(0.4, 0.25))
    rollout = torch.log(_t(0.5, 0.5))
    ref = torch.log(_t(0.25, 0.25))
    advantages = _t(1.0, -2.0)
    terms = policy_loss(
        logprobs,
        old,
        advantages,
        clip_low=0.2,
        clip_high=0.28,
        rollout_logprobs=rollout,
        tis_cap=1.0,
        ref_logprobs=ref,
        kl_coef=0.1,
    )
    # ratios 1.25, 1.0 -> surrogate -1.25, 2.0; IS weights min(0.4/0.5, 1) = 0.8, min(0.25/0.5, 1) = 0.5
    assert terms.is_weight is not None and terms.is_weight.tolist()[0] == pytest.approx([0.8, 0.5])
    assert terms.policy_gradient.tolist()[0] == pytest.approx([-1.0, 1.0])
    k3 = [math.exp(math.log(0.5)) - math.log(0.5) - 1, 0.0]  # d = log(0.25/0.5), log(1)
    assert terms.kl is not None and terms.kl.tolist()[0] == pytest.approx(k3)
    assert terms.total.tolist()[0] == pytest.approx([-1.0 + 0.1 * k3[0], 1.0])


def test_the_entropy_bonus_subtracts_the_weighted_entropy_and_its_gradient_flattens() -> None:
    logits = torch.tensor([[[2.0, 0.0, -1.0]]], requires_grad=True)
    log_p = torch.log_softmax(logits, -1)
    entropy = -(log_p.exp() * log_p).sum(-1)  # [1, 1]
    chosen = log_p[..., 0]
    terms = policy_loss(chosen, chosen.detach(), _t(0.0), clip_low=0.2, clip_high=0.2,
                        entropy=entropy, entropy_coef=0.5)
    assert terms.total.item() == pytest.approx(-0.5 * entropy.item())
    terms.total.sum().backward()
    assert logits.grad is not None
    after = torch.log_softmax(logits.detach() - 0.1 * logits.grad, -1)
    assert -(after.exp() * after).sum().item() > entropy.item()  # a descent step raises the entropy
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(chosen, chosen.detach(), _t(0.0), clip_low=0.2, clip_high=0.2,
                    entropy=entropy.detach(), entropy_coef=0.5)


def test_policy_loss_needs_rollout_logprobs_for_truncated_importance_sampling() -> None:
    with pytest.raises(ValueError, match="rollout_logprobs"):
        policy_loss(_t(0.0), _t(0.0), _t(1.0), clip_low=0.2, clip_high=0.2, tis_cap=2.0)


def test_learning_rate_warms_up_linearly_then_holds_or_follows_a_cosine() -> None:
    constant = TrainSettings(optim=OptimSettings(learning_rate=1.0, warmup_steps=3))
    assert [learning_rate_at(s, constant) for s in range(5)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])
    cosine = TrainSettings(
        optim=OptimSettings(learning_rate=1.0, warmup_steps=1, lr_schedule="cosine", min_lr_ratio=0.1), total_steps=5
    )
    rates = [learning_rate_at(s, cosine) for s in range(7)]
    assert rates[0] == pytest.approx(0.5)
    assert rates[1] == pytest.approx(1.0)
    assert rates[3] == pytest.approx(0.1 + 0.9 * 0.5)  # halfway through the decay
    assert rates[5] == pytest.approx(0.1) and rates[6] == pytest.approx(0.1)


def test_run_config_rejects_unknown_fields_and_out_of_range_values() -> None:
    with pytest.raises(ValueError, match="rnk"):
        TrainSettings.from_json('{"lora": {"rnk": 8}}')
    with pytest.raises(ValueError):
        TrainSettings.from_json('{"loss": {"clip_low": 1.5}}')
    with pytest.raises(ValueError, match="finite"):
        TrainSettings.from_json('{"optim": {"max_grad_norm": Infinity}}')
    with pytest.raises(ValueError, match="total_steps"):
        TrainSettings(optim=OptimSettings(lr_schedule="cosine"))
    assert TrainSettings.from_json("") == TrainSettings()


@pytest.mark.parametrize(("mode", "expected_sign"), [("token_mean", -1.0), ("sequence_mean", 0.0)])
def test_only_sequence_mean_leaves_the_end_of_turn_token_without_a_length_driven_push(
    mode: str, expected_sign: float
) -> None:
    # One group: a solved episode of 4 turns (advantage +1) and a failed one of 10 turns (-1).
    # Every turn generates an action token and an end-of-turn token, so the end-of-turn tokens
    # get the summed weight * advantage of half the trajectory's generated tokens.
    turns = [4, 10]
    advantages = torch.tensor([[1.0], [-1.0]])
    mask = torch.zeros(2, 20)
    for row, n in enumerate(turns):
        mask[row, : 2 * n] = 1.0
    weights = aggregation_weights(mask, mode, num_tokens=int(mask.sum()), num_sequences=2)  # type: ignore[arg-type]
    push = float((weights * advantages * mask).sum() / 2)  # the end-of-turn half of the push
    # token_mean: the longer, failed episode outweighs the solved one and the model is taught to
    # stop ending its turns; sequence_mean: each trajectory weighs 1/S whatever its length.
    if expected_sign:
        assert math.copysign(1.0, push) == expected_sign and abs(push) > 0.1
    else:
        assert push == pytest.approx(0.0, abs=1e-6)


def test_the_learner_benchmark_sends_settings_the_learner_accepts() -> None:
    from mmrl.bench.learner import train_settings

    sent = TrainSettings.from_json(json.dumps(train_settings(4, True)))
    assert (sent.optim.micro_batch_size, sent.optim.activation_checkpointing) == (4, True)
