from __future__ import annotations

from pathlib import Path

import pytest

from services.common.conversation import ChatTokens, TokenConversation, expand_image_placeholders


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _engine_expand(conv: TokenConversation, chat: ChatTokens, per_image: int = 25) -> list[int]:
    return expand_image_placeholders(conv.compact_ids, chat.image_pad, [per_image] * len(conv.images))


def test_two_turns_record_the_expanded_ids_with_loss_mask_on_generated_tokens_only(tokenizer) -> None:
    chat = ChatTokens.from_tokenizer(tokenizer)
    conv = TokenConversation(chat)
    conv.add_system(tokenizer, "Solve the maze.")
    conv.add_observation(tokenizer, "Moves left: 20.", [b"frame-1"])
    first = _engine_expand(conv, chat)
    down = tokenizer.encode("down", add_special_tokens=False) + [chat.im_end]
    conv.add_generation(first, down, [-0.5] * len(down))
    conv.add_observation(tokenizer, "Moves left: 19.", [b"frame-2"])
    second = _engine_expand(conv, chat)
    left = tokenizer.encode("left", add_special_tokens=False)  # cut by max_tokens: no <|im_end|>
    conv.add_generation(second, left, [-0.25] * len(left))

    assert conv.num_turns == 2
    assert conv.record_ids.count(chat.image_pad) == 50
    assert conv.compact_ids.count(chat.image_pad) == 2
    assert len(conv.record_ids) == len(conv.loss_mask) == len(conv.logprobs)
    trained = [t for t, m in zip(conv.record_ids, conv.loss_mask, strict=True) if m]
    assert trained == down + left
    assert sorted({lp for lp, m in zip(conv.logprobs, conv.loss_mask, strict=True) if m}) == [-0.5, -0.25]
    # A cut generation is closed by template tokens that are not trained on.
    assert conv.record_ids[-2:] == [chat.im_end, *chat.newline]
    assert conv.loss_mask[-2:] == [0, 0]
    assert tokenizer.decode(conv.record_ids[conv.turn_starts[1]:]).startswith("<|im_start|>user")


def test_an_engine_prompt_that_rewrites_history_is_refused(tokenizer) -> None:
    chat = ChatTokens.from_tokenizer(tokenizer)
    conv = TokenConversation(chat)
    conv.add_observation(tokenizer, "Moves left: 20.", [b"f"])
    conv.add_generation(_engine_expand(conv, chat), [chat.im_end], [-1.0])
    conv.add_observation(tokenizer, "Moves left: 19.", [b"g"])
    expanded = _engine_expand(conv, chat, per_image=24)
    with pytest.raises(ValueError, match="does not extend"):
        conv.add_generation(expanded, [chat.im_end], [-1.0])


def test_placeholder_and_image_counts_must_agree() -> None:
    with pytest.raises(ValueError):
        expand_image_placeholders([1, 9, 2], image_pad=9, tokens_per_image=[3, 3])
    assert expand_image_placeholders([1, 9, 2], image_pad=9, tokens_per_image=[3]) == [1, 9, 9, 9, 2]


def test_a_trajectory_carries_the_record_and_only_the_images_a_turn_answered(tokenizer) -> None:
    chat = ChatTokens.from_tokenizer(tokenizer)
    conv = TokenConversation(chat)
    conv.add_observation(tokenizer, "Moves left: 20.", [b"frame-1"])
    down = tokenizer.encode("down", add_special_tokens=False) + [chat.im_end]
    conv.add_generation(_engine_expand(conv, chat), down, [-0.5] * len(down))
    conv.add_observation(tokenizer, "Moves left: 19.", [b"frame-2"])  # the episode ends before answering it

    traj = conv.to_trajectory("t", [0.5 * m for m in conv.loss_mask], reward=1.0, adapter_version=3, group_id="g")
    traj.validate()
    assert traj.images == (b"frame-1",)
    assert traj.token_ids == tuple(conv.record_ids) and traj.loss_mask == tuple(conv.loss_mask)
    assert traj.logprobs == tuple(conv.logprobs) and traj.turn_starts == tuple(conv.turn_starts)
    assert (traj.reward, traj.adapter_version, traj.group_id) == (1.0, 3, "g")
