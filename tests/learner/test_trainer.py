"""Training steps of an in-process single-rank learner on the tiny Qwen3-VL with LoRA."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from services.common.trajectory import Trajectory
from services.learner.batch import collate, prepare_batch
from services.learner.policy import load_base_model, token_logprobs
from tests.learner.conftest import adapter_weights, base_weights
from tests.learner.settings import train_json

FAST = {"learning_rate": 0.01, "micro_batch_size": 4}


def _configure(make_driver: Callable[..., Any], run_id: str = "run", **config: Any) -> Any:
    driver = make_driver()
    driver.configure(run_id, train_json(**{**FAST, **config}))
    return driver


def test_a_lora_step_changes_adapter_weights_and_leaves_base_weights_bit_identical(
    make_driver: Callable[..., Any], trajectories: list[Trajectory]
) -> None:
    driver = _configure(make_driver)
    base_before, adapter_before = base_weights(driver), adapter_weights(driver)
    assert all("lora_" in name and "visual" not in name for name in adapter_before)
    for _ in range(2):  # B starts at zero, so A only moves from the second step on
        result = driver.train_step("run", trajectories)
        assert not result.skipped and result.metrics["train/grad_norm"] > 0
    adapter_after = adapter_weights(driver)
    changed = [n for n in adapter_before if not torch.equal(adapter_before[n], adapter_after[n])]
    assert {n.split(".lora_")[1].split(".")[0] for n in changed} == {"A", "B"}
    assert len(changed) == len(adapter_before)
    base_after = base_weights(driver)
    assert base_after.keys() == base_before.keys()
    assert all(torch.equal(base_before[n], base_after[n]) for n in base_before)
    assert driver.state("run").step == 2


def test_kl_to_the_reference_is_zero_while_the_adapter_is_zero(
    make_driver: Callable[..., Any], trajectories: list[Trajectory]
) -> None:
    driver = _configure(make_driver, kl_coef=0.5)
    first = driver.train_step("run", trajectories[:4]).metrics
    assert first["train/kl"] == 0.0
    second = driver.train_step("run", trajectories[:4]).metrics
    assert second["train/kl"] > 0.0
    assert second["train/loss"] == pytest.approx(second["train/pg_loss"] + 0.5 * second["train/kl"], rel=1e-5)


def test_an_entropy_bonus_alone_raises_the_policy_entropy(
    make_driver: Callable[..., Any], trajectories: list[Trajectory]
) -> None:
    flat = [dataclasses.replace(t, advantages=tuple(0.0 for _ in t.advantages)) for t in trajectories[:4]]
    driver = _configure(make_driver, entropy_coef=1.0)
    entropies = [driver.train_step("run", flat).metrics["train/entropy"] for _ in range(3)]
    assert entropies[2] > entropies[0]  # no advantage anywhere: only the bonus moves the policy
    metrics = driver.train_step("run", flat).metrics
    assert metrics["train/loss"] == pytest.approx(metrics["train/pg_loss"] - metrics["train/entropy"], rel=1e-4)


@pytest.fixture
def mixed_lengths(tokenizer: Any, trajectories: list[Trajectory]) -> list[Trajectory]:
    """The 3-turn trajectories with 1- and 2-turn episodes in between: micro-batches are sorted by
    length, so their composition differs from the batch order."""
    from mmrl.bench import synthetic
    from services.common.conversation import ChatTokens

    generate = synthetic.fake_generator(ChatTokens.from_tokenizer(tokenizer), tokenizer, tokens_per_image=25)
    short = [synthetic.play_episodes(generate, tokenizer, num_groups=1, group_size=2, num_turns=turns, seed=turns)
             for turns in (1, 2)]
    played = [trajectories[0], *short[0], *trajectories[1:4], *short[1], *trajectories[4:]]
    return synthetic.with_advantages(played, [1.0, -0.5, 0.25, -1.0, 0.75, 0.5, 0.3, -0.2, 0.6, -0.9])


@pytest.fixture
def mixed_items(mixed_lengths: list[Trajectory], tiny_model_dir: Path) -> list[Any]:
    """`mixed_lengths` prepared for the tiny model, in batch order."""
    from services.learner.batch import FrameProcessor, ModelSpec
    from services.learner.policy import load_processor

    spec = ModelSpec.from_config(load_base_model(tiny_model_dir).config)
    return prepare_batch(mixed_lengths, spec, FrameProcessor(load_processor(tiny_model_dir).image_processor))


def test_micro_batches_group_trajectories_of_similar_length(
    mixed_lengths: list[Trajectory], mixed_items: list[Any]
) -> None:
    from services.learner.trainer import micro_batches

    items = mixed_items
    chunks = micro_batches(items, 4)
    assert [len(c) for c in chunks] == [4, 4, 2]
    assert sorted(i.trajectory_id for c in chunks for i in c) == sorted(t.trajectory_id for t in mixed_lengths)
    widths = [[i.num_tokens for i in c] for c in chunks]
    assert all(max(a) <= min(b) for a, b in itertools.pairwise(widths))
    padded = sum(len(c) * max(w) for c, w in zip(chunks, widths, strict=True))
    unsorted = sum(len(c) * max(i.num_tokens for i in c) for c in (items[0:4], items[4:8], items[8:]))
    assert padded < unsorted


def test_micro_batches_count_distinct_sequences_and_keep_each_ones_copies_together(
    mixed_items: list[Any],
) -> None:
    from services.learner.trainer import micro_batches

    items = mixed_items
    copies = [dataclasses.replace(item, trajectory_id=f"{item.trajectory_id}-copy{k}")
              for k, item in enumerate(items[::2])]
    chunks = micro_batches([*items, *copies], 3)
    keys = [[item.sequence_key for item in chunk] for chunk in chunks]
    assert [len(set(k)) for k in keys] == [3, 3, 3, 1]  # 10 distinct sequences, 3 a micro-batch
    assert sum(len(chunk) for chunk in chunks) == len(items) + len(copies)
    for copy in copies:  # each copy sits beside its original
        [chunk] = [c for c in chunks if copy in c]
        assert sum(item.sequence_key == copy.sequence_key for item in chunk) == 2


def test_a_step_runs_each_distinct_sequence_once_and_reports_how_many(
    make_driver: Callable[..., Any], trajectories: list[Trajectory]
) -> None:
    copies = [dataclasses.replace(t, trajectory_id=f"{t.trajectory_id}-again", advantages=tuple(-a for a in t.advantages))
              for t in trajectories[:2]]
    distinct = len({(t.token_ids, t.images) for t in trajectories})
    metrics = _configure(make_driver).train_step("run", [*trajectories, *copies]).metrics
    assert metrics["train/num_trajectories"] == len(trajectories) + 2
    assert metrics["train/num_distinct_sequences"] == distinct


@pytest.mark.parametrize("loss_agg", ["token_mean", "sequence_mean"])
def test_the_step_does_not_depend_on_the_micro_batch_size(
    loss_agg: str, make_driver: Callable[..., Any], mixed_lengths: list[Trajectory]
) -> None:
    trajectories = mixed_lengths
    results = []
    for micro_batch_size in (1, 3, 10):
        # A large Adam epsilon keeps updates proportional to small gradients (no sign-like steps
        # that amplify summation-order noise), so the weights check the normalisation too.
        driver = _configure(make_driver, micro_batch_size=micro_batch_size, loss_agg=loss_agg, adam_eps=1e-3)
        metrics = [driver.train_step("run", trajectories).metrics for _ in range(2)]
        results.append((metrics, adapter_weights(driver)))
    metrics_a, adapter_a = results[0]
    for metrics_b, adapter_b in results[1:]:
        for step_a, step_b in zip(metrics_a, metrics_b, strict=True):
            for key in ("train/loss", "train/grad_norm", "train/entropy", "train/logprob_abs_diff_vs_rollout"):
                assert step_a[key] == pytest.approx(step_b[key], rel=1e-5, abs=1e-7), key
        for name in adapter_a:
            torch.testing.assert_close(adapter_a[name], adapter_b[name], rtol=1e-4, atol=1e-6)


def test_a_non_finite_loss_skips_the_optimiser_step_and_leaves_weights_unchanged(
    make_driver: Callable[..., Any], trajectories: list[Trajectory]
) -> None:
    driver = _configure(make_driver)
    driver.train_step("run", trajectories[:3])
    before = adapter_weights(driver)
    huge = [dataclasses.replace(t, advantages=tuple(3e38 * m for m in t.loss_mask)) for t in trajectories[:3]]
    result = driver.train_step("run", huge)
    assert result.skipped and result.metrics["train/skipped"] == 1.0
    assert not math.isfinite(result.metrics["train/grad_norm"])
    after = adapter_weights(driver)
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert result.step == 2  # skipped steps count
    assert not driver.train_step("run", trajectories[:3]).skipped  # and training goes on


def test_bad_input_raises_naming_the_trajectory_and_changes_no_state(
    make_driver: Callable[..., Any], trajectories: list[Trajectory]
) -> None:
    driver = _configure(make_driver)
    driver.train_step("run", trajectories[:2])
    before = adapter_weights(driver)
    bad = list(trajectories[:3])
    bad[1] = dataclasses.replace(bad[1], logprobs=bad[1].logprobs[:-1])
    with pytest.raises(ValueError, match=r"trajectory #1: trajectory 'ep-0001': logprobs has"):
        driver.train_step("run", bad)
    with pytest.raises(ValueError, match="no trajectories"):
        driver.train_step("run", [])
    assert driver.state("run").step == 1
    after = adapter_weights(driver)
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_truncated_importance_sampling_reports_its_mean_weight(
    make_driver: Callable[..., Any], trajectories: list[Trajectory]
) -> None:
    driver = _configure(make_driver, tis_cap=2.0)
    metrics = driver.train_step("run", trajectories[:3]).metrics
    # The stand-in engine's log-probs are far off the model's: weights are small or capped.
    assert 0.0 < metrics["train/tis_weight_mean"] < 0.9
    assert "train/kl" not in metrics
    # An engine that gave every token a far smaller probability than the learner: all capped.
    unlikely = [dataclasses.replace(t, logprobs=tuple(-50.0 for _ in t.logprobs)) for t in trajectories[:3]]
    assert driver.train_step("run", unlikely).metrics["train/tis_weight_mean"] == pytest.approx(2.0)
    without = _configure(make_driver).train_step("run", unlikely).metrics
    assert "train/tis_weight_mean" not in without


def test_checkpoint_then_restart_gives_the_same_next_step_as_an_uninterrupted_run(
    make_driver: Callable[..., Any], trajectories: list[Trajectory], tmp_path: Any
) -> None:
    # Dropout on the LoRA input makes the step depend on the restored random generator state; with two
    # mini-batches the old-policy pass comes first, and it runs without dropout after a restart too.
    config = {"lora_dropout": 0.3, "weight_decay": 0.1, "warmup_steps": 3, "num_minibatches": 2}
    uninterrupted = _configure(make_driver, **config)
    for _ in range(2):
        uninterrupted.train_step("run", trajectories)
    step, path, _ = uninterrupted.save_checkpoint("run")
    assert step == 4 and path.name == "step_000004"  # two optimiser steps per TrainStep
    expected = uninterrupted.train_step("run", trajectories).metrics
    expected_adapter = adapter_weights(uninterrupted)

    restarted = make_driver()  # a fresh learner on the same shared storage
    state = restarted.configure("run", train_json(**{**FAST, **config}))
    assert state.step == 4 and state.restored_from == str(path)
    resumed = restarted.train_step("run", trajectories).metrics
    for key in ("train/loss", "train/grad_norm", "train/learning_rate", "train/entropy"):
        assert resumed[key] == expected[key], key
    resumed_adapter = adapter_weights(restarted)
    assert all(torch.equal(expected_adapter[n], resumed_adapter[n]) for n in expected_adapter)


def test_several_minibatches_take_one_optimizer_step_each_and_clip_the_off_policy_ones(
    make_driver: Callable[..., Any], trajectories: list[Trajectory]
) -> None:
    on_policy = _configure(make_driver, learning_rate=0.05)
    single = on_policy.train_step("run", trajectories).metrics
    assert single["train/clip_fraction"] == 0.0 and single["train/optimizer_steps"] == 1.0

    driver = _configure(make_driver, learning_rate=0.05, num_minibatches=3, warmup_steps=5)
    first = driver.train_step("run", trajectories)
    assert first.step == 3 and first.metrics["train/optimizer_steps"] == 3.0
    assert first.metrics["train/learning_rate"] == pytest.approx(0.05 * 3 / 6)  # the third warm-up step
    # The first mini-batch is on-policy: the log-prob check is against the pre-step policy.
    assert first.metrics["train/logprob_abs_diff_vs_rollout"] == pytest.approx(
        single["train/logprob_abs_diff_vs_rollout"], rel=1e-5
    )
    second = driver.train_step("run", trajectories).metrics
    # After the first mini-batch's update, the policy has moved: ratios leave [0.8, 1.28].
    assert 0.0 < second["train/clip_fraction"] < 1.0
    assert driver.state("run").step == 6


def _with_learner_logprobs(driver: Any, trajectories: list[Trajectory], model_dir: Path) -> list[Trajectory]:
    """The trajectories with the base model's own log-probs as their rollout log-probs: what an
    engine that computes exactly what the learner does would report for adapter version 0."""
    engine, model = driver.engine, load_base_model(model_dir)
    own = []
    for traj in trajectories:
        [item] = prepare_batch([traj], engine.spec, engine.frames)
        batch = collate([item], engine.spec.pad_token_id, engine.spec.image_token_id)
        with torch.no_grad():
            logprobs, _ = token_logprobs(model, batch, "cpu", with_entropy=False)
        values = list(traj.logprobs)
        for j, column in enumerate(batch.target_cols.tolist()):
            values[column] = float(logprobs[0, j])
        own.append(dataclasses.replace(traj, logprobs=tuple(values)))
    return own


def _assert_same_step_from_either_old_policy(
    make_driver: Callable[..., Any], own: list[Trajectory], **config: Any
) -> None:
    """One TrainStep on trajectories carrying the learner's own log-probs (`_with_learner_logprobs`)
    gives the same adapter with the learner's and with the rollout's log-probs as the old policy."""
    adapters = {}
    for source in ("learner", "rollout"):
        driver = _configure(make_driver, learning_rate=0.05, old_logprobs=source, **config)
        metrics = driver.train_step("run", own).metrics  # sampled by version 0: the learner's own
        assert metrics["train/logprob_abs_diff_vs_rollout_max"] < 1e-5
        adapters[source] = adapter_weights(driver)
    for name, weight in adapters["learner"].items():
        assert torch.allclose(weight, adapters["rollout"][name], atol=1e-5), name


def test_rollout_logprobs_as_the_old_policy_give_the_learners_step_when_they_agree(
    make_driver: Callable[..., Any], trajectories: list[Trajectory], tiny_model_dir: Path
) -> None:
    own = _with_learner_logprobs(make_driver(), trajectories, tiny_model_dir)
    _assert_same_step_from_either_old_policy(make_driver, own, num_minibatches=3)

    # Log-probs that disagree with the learner's are used as they are: even one mini-batch clips.
    driver = _configure(make_driver, learning_rate=0.05, old_logprobs="rollout")
    assert driver.train_step("run", trajectories).metrics["train/clip_fraction"] > 0.0


def test_epochs_pass_over_the_batch_again_against_the_pre_step_policy(
    make_driver: Callable[..., Any], trajectories: list[Trajectory], tiny_model_dir: Path
) -> None:
    driver = _configure(make_driver, learning_rate=0.05, num_epochs=2, warmup_steps=5)
    result = driver.train_step("run", trajectories)
    assert result.step == 2 and result.metrics["train/optimizer_steps"] == 2.0
    assert result.metrics["train/learning_rate"] == pytest.approx(0.05 * 2 / 6)  # the second warm-up step
    # The second pass is off-policy: its ratios against the pre-step policy leave [0.8, 1.28].
    assert 0.0 < result.metrics["train/clip_fraction"] < 1.0

    # The old policy of the second pass is the one from before the first: the learner's log-probs
    # and rollout log-probs equal to them give the same update (a ratio of 1 there would not).
    own = _with_learner_logprobs(make_driver(), trajectories, tiny_model_dir)
    _assert_same_step_from_either_old_policy(make_driver, own, num_epochs=2)


def test_the_rollout_check_compares_the_learners_logprobs_also_when_the_rollouts_are_the_old_policy(
    make_driver: Callable[..., Any], trajectories: list[Trajectory]
) -> None:
    # The stand-in engine's log-probs are far off the model's: the check must say so in both modes.
    diffs = {}
    for source in ("learner", "rollout"):
        metrics = _configure(make_driver, old_logprobs=source).train_step("run", trajectories).metrics
        diffs[source] = (
            metrics["train/logprob_abs_diff_vs_rollout"],
            metrics["train/logprob_abs_diff_vs_rollout_max"],
        )
    assert diffs["learner"][0] > 0.1
    assert diffs["rollout"] == pytest.approx(diffs["learner"], rel=1e-5)

    # With several mini-batches, only the first is seen before an update: the check covers it alone.
    first = trajectories[: len(trajectories) // 3]
    alone = _configure(make_driver, old_logprobs="rollout").train_step("run", first).metrics
    split = _configure(make_driver, old_logprobs="rollout", num_minibatches=3).train_step("run", trajectories)
    assert split.metrics["train/logprob_abs_diff_vs_rollout"] == pytest.approx(
        alone["train/logprob_abs_diff_vs_rollout"], rel=1e-5
    )


def test_a_checkpoint_is_restored_only_under_the_adapter_settings_it_was_trained_with(
    make_driver: Callable[..., Any], trajectories: list[Trajectory]
) -> None:
    from services.learner.driver import StateError

    driver = _configure(make_driver)
    driver.train_step("run", trajectories[:2])
    _, path, _ = driver.save_checkpoint("run")
    # Same rank and targets, another scale: the tensors would fit but compute another policy.
    with pytest.raises(StateError, match="'alpha': 32.*asks for .*'alpha': 64"):
        make_driver().configure("run", train_json(**FAST, lora_alpha=64))
    # A directory with a valid manifest that is not a checkpoint (an adapter version) is refused as such.
    adapter_dir = driver.publish("run").path
    with pytest.raises(StateError, match=r"is not a learner checkpoint: its trainer_state.json cannot be read"):
        driver.load_checkpoint("run", str(adapter_dir))
    assert driver.load_checkpoint("run", str(path)).step == 1


def test_activation_checkpointing_recomputes_the_layers_and_gives_the_same_step(
    make_driver: Callable[..., Any], trajectories: list[Trajectory]
) -> None:
    results = {}
    for checkpointing in (False, True):
        driver = _configure(make_driver, activation_checkpointing=checkpointing)
        model = driver.engine.run.model
        (mlp,) = [m for n, m in model.named_modules() if n.endswith("language_model.layers.0.mlp")]
        calls: list[int] = []
        mlp.register_forward_pre_hook(lambda *args, calls=calls: calls.append(1))  # a recompute stops early
        metrics = driver.train_step("run", trajectories).metrics
        results[checkpointing] = (len(calls), metrics, adapter_weights(driver))
    (plain_calls, plain, plain_adapter), (calls, checkpointed, adapter) = results[False], results[True]
    assert calls == 2 * plain_calls  # every forward with gradients is run again in the backward pass
    for key in ("train/loss", "train/grad_norm", "train/entropy"):
        assert checkpointed[key] == pytest.approx(plain[key], rel=1e-5, abs=1e-7), key
    assert all(torch.allclose(adapter[n], plain_adapter[n], atol=1e-6) for n in adapter)
