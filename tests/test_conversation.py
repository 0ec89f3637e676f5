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


def _play(tokenizer, chat: ChatTokens, conv: TokenConversation, moves: list[str]) -> list[list[int]]:
    """Plays `moves` (one frame per observation, frame-<turn>); returns each turn's expanded prompt."""
    prompts = []
    conv.add_system(tokenizer, "Solve the maze.")
    for turn, move in enumerate(moves):
        conv.add_observation(tokenizer, f"Moves left: {20 - turn}.", [f"frame-{turn}".encode()])
        prompts.append(_engine_expand(conv, chat))
        generated = tokenizer.encode(move, add_special_tokens=False) + [chat.im_end]
        conv.add_generation(prompts[-1], generated, [-0.1 * (turn + 1)] * len(generated))
    return prompts


def test_a_window_of_one_turn_prompts_with_the_last_turn_and_trains_each_turn_once(tokenizer) -> None:
    chat = ChatTokens.from_tokenizer(tokenizer)
    whole, windowed = TokenConversation(chat), TokenConversation(chat, window=1)
    moves = ["down", "left", "up"]
    whole_prompts, prompts = _play(tokenizer, chat, whole, moves), _play(tokenizer, chat, windowed, moves)

    # Turn 2's prompt: the system turn, turn 1 (frame-1 and its answer) and frame-2, without turn 0.
    assert prompts[0] == whole_prompts[0]
    system = chat.system_turn(tokenizer, "Solve the maze.")
    turn0 = len(whole_prompts[1]) - len(whole_prompts[0]) + len(system)  # where turn 1 starts in the whole record
    assert prompts[2] == system + whole_prompts[2][turn0:]
    assert windowed.compact_ids.count(chat.image_pad) == 2 and windowed.images == [b"frame-1", b"frame-2"]

    segments = windowed.segments()
    assert [s.first_turn for s in segments] == [0, 1, 2] and windowed.num_turns == 3
    for turn, (segment, move) in enumerate(zip(segments, moves, strict=True)):
        trained = [t for t, m in zip(segment.record_ids, segment.loss_mask, strict=True) if m]
        assert trained == tokenizer.encode(move, add_special_tokens=False) + [chat.im_end]
        assert segment.turn_starts == (0,)
        assert segment.images == tuple(f"frame-{t}".encode() for t in range(max(turn - 1, 0), turn + 1))
    trajectories = windowed.to_trajectories("e", [list(map(float, s.loss_mask)) for s in segments], reward=1.0)
    assert [t.trajectory_id for t in trajectories] == ["e-t0", "e-t1", "e-t2"]
    assert {t.segments for t in trajectories} == {3}
    for t in trajectories:
        t.validate()
    with pytest.raises(ValueError, match="to_trajectories"):
        windowed.to_trajectory("e", [], reward=1.0)


def test_a_window_of_zero_turns_prompts_with_the_current_observation_alone(tokenizer) -> None:
    chat = ChatTokens.from_tokenizer(tokenizer)
    conv = TokenConversation(chat, window=0)
    prompts = _play(tokenizer, chat, conv, ["down", "left"])
    assert prompts[1] == chat.system_turn(tokenizer, "Solve the maze.") + expand_image_placeholders(
        chat.user_turn(tokenizer, "Moves left: 19.", 1), chat.image_pad, [25])
    # The unwindowed conversation is one segment, the whole record.
    whole = TokenConversation(chat)
    _play(tokenizer, chat, whole, ["down", "left"])
    (only,) = whole.segments()
    assert list(only.record_ids) == whole.record_ids and only.first_turn == 0 and len(only.turn_starts) == 2
    with pytest.raises(ValueError, match="window"):
        TokenConversation(chat, window=-1)
