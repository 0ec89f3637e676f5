"""Trajectories -> model inputs: validation naming the trajectory, padding, scored positions,
frame processing and sharding across ranks."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from mmrl.bench.synthetic import maze_frame
from services.common.trajectory import Trajectory
from services.learner.batch import (
    FrameProcessor,
    ModelSpec,
    collate,
    image_token_runs,
    prepare_batch,
)
from services.learner.distributed import plan_shards
from services.learner.policy import load_base_model, token_logprobs


@pytest.fixture(scope="module")
def spec(tiny_model_dir: Path) -> ModelSpec:
    from transformers import AutoConfig

    return ModelSpec.from_config(AutoConfig.from_pretrained(tiny_model_dir))


@pytest.fixture(scope="module")
def frames(tiny_model_dir: Path) -> FrameProcessor:
    from transformers import AutoProcessor

    return FrameProcessor(AutoProcessor.from_pretrained(tiny_model_dir).image_processor)


def _replace(traj: Trajectory, **changes: Any) -> Trajectory:
    return dataclasses.replace(traj, **changes)


def _shorter(name: str) -> Callable[[Trajectory], Trajectory]:
    return lambda t: _replace(t, **{name: getattr(t, name)[:-1]})


def _frame_of_another_size(t: Trajectory) -> Trajectory:
    buffer = io.BytesIO()
    Image.new("RGB", (112, 112), (9, 9, 9)).save(buffer, format="PNG")
    return _replace(t, images=(buffer.getvalue(), *t.images[1:]))


BAD_INPUTS: dict[str, tuple[Callable[[Trajectory], Trajectory], str]] = {
    "logprobs shorter than token_ids": (_shorter("logprobs"), "logprobs has"),
    "advantages shorter than token_ids": (_shorter("advantages"), "advantages has"),
    "loss_mask shorter than token_ids": (_shorter("loss_mask"), "loss_mask has"),
    "token id outside the vocabulary": (
        lambda t: _replace(t, token_ids=(*t.token_ids[:-1], 10**6)),
        "outside the vocabulary",
    ),
    "negative token id": (lambda t: _replace(t, token_ids=(-1, *t.token_ids[1:])), "outside the vocabulary"),
    "image that does not decode": (
        lambda t: _replace(t, images=(b"not a png", *t.images[1:])),
        "image 0 does not decode",
    ),
    "truncated PNG": (
        lambda t: _replace(t, images=(t.images[0][:40], *t.images[1:])),
        "image 0 does not decode",
    ),
    "one image too few": (lambda t: _replace(t, images=t.images[:-1]), "placeholder runs but"),
    "image of another size than its placeholder run": (
        _frame_of_another_size,
        "placeholder run of 25 tokens",
    ),
    "generated first token": (lambda t: _replace(t, loss_mask=(1, *t.loss_mask[1:])), "first token"),
    "nothing generated": (lambda t: _replace(t, loss_mask=(0,) * len(t.loss_mask)), "no generated tokens"),
    "non-finite advantage": (
        lambda t: _replace(t, advantages=tuple(float("nan") if m else 0.0 for m in t.loss_mask)),
        "not finite",
    ),
    "mask value 2": (lambda t: _replace(t, loss_mask=tuple(2 if m else 0 for m in t.loss_mask)), "0 or 1"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_trajectories_are_rejected_with_a_message_naming_them(
    case: str, trajectories: list[Trajectory], spec: ModelSpec, frames: FrameProcessor
) -> None:
    corrupt, expected = BAD_INPUTS[case]
    batch = list(trajectories)
    batch[2] = corrupt(batch[2])
    with pytest.raises(ValueError, match=expected) as info:
        prepare_batch(batch, spec, frames)
    assert "trajectory #2" in str(info.value)
    assert repr(trajectories[2].trajectory_id) in str(info.value)


def test_an_empty_batch_is_rejected(spec: ModelSpec, frames: FrameProcessor) -> None:
    with pytest.raises(ValueError, match="no trajectories"):
        prepare_batch([], spec, frames)


def test_a_right_padded_row_scores_as_it_does_alone_and_the_model_gets_no_attention_mask(
    tokenizer: Any, tiny_model_dir: Path, spec: ModelSpec, frames: FrameProcessor
) -> None:
    from mmrl.bench import synthetic
    from services.common.conversation import ChatTokens

    generate = synthetic.fake_generator(ChatTokens.from_tokenizer(tokenizer), tokenizer, tokens_per_image=25)
    long, short = (synthetic.with_advantages(synthetic.play_episodes(generate, tokenizer, 1, 1, turns), [1.0])[0]
                   for turns in (3, 1))
    [long_item, short_item] = prepare_batch([long, short], spec, frames)
    padded = collate([long_item, short_item], spec.pad_token_id, spec.image_token_id)
    assert int((padded.attention_mask == 0).sum()) > 50  # the short row is mostly padding
    assert "attention_mask" not in padded.model_inputs("cpu")  # SDPA's causal kernel, no explicit mask

    model = load_base_model(tiny_model_dir)
    with torch.no_grad():
        together, _ = token_logprobs(model, padded, "cpu", with_entropy=False)
        for row, item in enumerate([long_item, short_item]):
            alone_batch = collate([item], spec.pad_token_id, spec.image_token_id)
            alone, _ = token_logprobs(model, alone_batch, "cpu", with_entropy=False)
            scored = padded.loss_mask[row].bool()
            assert int(scored.sum()) == alone.shape[1]
            assert torch.allclose(together[row][scored], alone[0], atol=1e-5), row


def test_collate_right_pads_and_gathers_only_generated_positions(
    trajectories: list[Trajectory], spec: ModelSpec, frames: FrameProcessor
) -> None:
    prepared = prepare_batch(trajectories[:3], spec, frames)
    short = dataclasses.replace(
        prepared[1],
        input_ids=prepared[1].input_ids[:-2],
        loss_mask=prepared[1].loss_mask[:-2],
        rollout_logprobs=prepared[1].rollout_logprobs[:-2],
        advantages=prepared[1].advantages[:-2],
    )
    batch = collate([prepared[0], short], spec.pad_token_id, spec.image_token_id)
    width = prepared[0].num_tokens
    assert batch.input_ids.shape == (2, width)
    assert batch.attention_mask[1].tolist() == [1] * (width - 2) + [0, 0]
    assert batch.input_ids[1, -2:].tolist() == [spec.pad_token_id] * 2
    # Every image-pad token of each row, and nothing else, is marked as image.
    assert batch.mm_token_type_ids.sum().item() == 2 * 3 * 25
    assert torch.equal(batch.mm_token_type_ids.bool(), batch.input_ids == spec.image_token_id)
    # Scored columns are exactly the generated ones, with the per-token data gathered there.
    generated = prepared[0].loss_mask.nonzero().squeeze(1)
    assert torch.equal(batch.target_cols, generated)
    assert torch.equal(batch.loss_mask[0], torch.ones(len(generated)))
    assert torch.equal(batch.advantages[0], prepared[0].advantages[generated])
    assert torch.equal(batch.rollout_logprobs[0], prepared[0].rollout_logprobs[generated])
    assert batch.image_grid_thw is not None and batch.image_grid_thw.tolist() == [[1, 10, 10]] * 6
    assert batch.pixel_values is not None and batch.pixel_values.shape[0] == 6 * 100


def test_trajectories_of_the_same_sequence_share_one_row_of_the_models_inputs(
    trajectories: list[Trajectory], spec: ModelSpec, frames: FrameProcessor, tiny_model_dir: Path
) -> None:
    # Two turns played from the same frame with the same move are one sequence to the model, with
    # the advantages of their own episodes; the batch runs it once and each reads its log-probs.
    first, other = prepare_batch(trajectories[:2], spec, frames)
    twin = dataclasses.replace(first, trajectory_id="twin", advantages=-2.0 * first.advantages, share=0.5)
    assert twin.sequence_key == first.sequence_key != other.sequence_key
    redrawn = dataclasses.replace(first, image_keys=(b"another frame", *first.image_keys[1:]))
    assert redrawn.sequence_key != first.sequence_key  # same tokens, another image
    items = [first, other, twin]
    batch = collate(items, spec.pad_token_id, spec.image_token_id)
    assert batch.input_ids.shape[0] == 2 and batch.rows is not None and batch.rows.tolist() == [0, 1, 0]
    assert batch.image_grid_thw is not None and len(batch.image_grid_thw) == len(batch.image_keys) == 6
    assert batch.trajectory_ids == [first.trajectory_id, other.trajectory_id, "twin"]
    assert torch.equal(batch.advantages[2], -2.0 * batch.advantages[0]) and batch.shares.tolist()[2] == 0.5
    assert collate([first, other], spec.pad_token_id, spec.image_token_id).rows is None

    # The gradient of any loss over the shared row is that of the rows run one by one.
    model = load_base_model(tiny_model_dir)
    param = model.lm_head.weight.requires_grad_(True)  # the base model loads frozen

    def grad_of(batches: list[Any]) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        for chunk in batches:
            logprobs, entropy = token_logprobs(model, chunk, "cpu")
            assert entropy is not None and entropy.shape == logprobs.shape == chunk.loss_mask.shape
            (logprobs * chunk.advantages * chunk.loss_mask * chunk.shares[:, None]).sum().backward()
        assert param.grad is not None
        return param.grad.clone()

    alone = [collate([item], spec.pad_token_id, spec.image_token_id) for item in items]
    together = grad_of([batch])
    torch.testing.assert_close(together, grad_of(alone), rtol=1e-4, atol=1e-6)
    assert together.abs().sum() > 0


def test_values_on_positions_not_trained_on_never_reach_the_loss(
    trajectories: list[Trajectory], spec: ModelSpec, frames: FrameProcessor
) -> None:
    # The contract asks for finite values only where loss_mask is 1; a micro-batch gathers every column
    # some row generates at, and 0 x NaN in the loss is still NaN.
    traj = trajectories[0]
    untrained = [i for i, m in enumerate(traj.loss_mask) if not m]
    advantages, logprobs = list(traj.advantages), list(traj.logprobs)
    for i in untrained:
        advantages[i], logprobs[i] = float("nan"), float("-inf")
    odd = dataclasses.replace(traj, advantages=tuple(advantages), logprobs=tuple(logprobs))
    (clean, prepared) = prepare_batch([traj, odd], spec, frames)
    assert torch.isfinite(prepared.advantages).all() and torch.isfinite(prepared.rollout_logprobs).all()
    assert torch.equal(prepared.advantages, clean.advantages)
    assert torch.equal(prepared.rollout_logprobs, clean.rollout_logprobs)


def test_frame_processor_gives_the_tensors_of_processing_a_trajectorys_frames_together(
    tiny_model_dir: Path,
) -> None:
    from transformers import AutoProcessor

    image_processor = AutoProcessor.from_pretrained(tiny_model_dir).image_processor
    cached = FrameProcessor(image_processor, max_cached=2)
    data = [maze_frame(seed) for seed in (1, 2, 1, 3)]
    pixels, grid = cached(data)
    together = image_processor(images=[Image.open(io.BytesIO(d)) for d in data], return_tensors="pt")
    assert torch.equal(pixels, together["pixel_values"])
    assert torch.equal(grid, together["image_grid_thw"])
    again, _ = cached(data)  # served partly from the cache, which stays bounded
    assert torch.equal(again, pixels) and len(cached._cache) == 2


def test_image_token_runs_finds_each_maximal_run() -> None:
    assert image_token_runs([1, 5, 5, 2, 5, 3, 5, 5, 5], 5) == [(1, 2), (4, 1), (6, 3)]
    assert image_token_runs([1, 2], 5) == []


def test_plan_shards_balances_lengths_and_pads_short_ranks() -> None:
    lengths = [10, 50, 30, 40, 20]
    shards = plan_shards(lengths, 2)
    assert shards == [[(1, False), (2, False), (0, False)], [(3, False), (4, False), (0, True)]]
    assert plan_shards(lengths, 1) == [[(1, False), (3, False), (2, False), (4, False), (0, False)]]
    tiny = plan_shards([7], 3)
    assert tiny == [[(0, False)], [(0, True)], [(0, True)]]
