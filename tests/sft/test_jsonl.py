"""`mmrl sft export`: the SFT's expert conversations, played on a real env service, as chat JSONL with
PNG frames that Hugging Face datasets loads and the model's chat template turns back into the ids."""

from __future__ import annotations

import json
from pathlib import Path

from mmrl.sft.config import SftConfig
from mmrl.sft.jsonl import write_jsonl
from tests.sft.test_data import play_expert


def _collapse_images(ids: tuple[int, ...], image_pad: int) -> list[int]:
    """Engine-expanded ids with each run of image placeholders back to one placeholder."""
    return [t for i, t in enumerate(ids) if t != image_pad or i == 0 or ids[i - 1] != image_pad]


def test_expert_conversations_export_as_chat_jsonl_that_the_chat_template_turns_back_into_their_ids(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoProcessor

    from services.common.conversation import ChatTokens

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    tokenizer = processor.tokenizer
    config = SftConfig(base_model=str(tiny_model_dir), out=str(tmp_path / "unused"), num_tasks=4,
                       perturb_prob=0.3, seed=1)
    played = play_expert(config, tokenizer)
    counts = write_jsonl(played, tokenizer, tmp_path / "data" / "sft.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "data" / "sft.jsonl").read_text().splitlines()]
    assert counts["conversations"] == len(rows) == len(played) == 4
    chat = ChatTokens.from_tokenizer(tokenizer)
    detours = 0
    for row, trajectory in zip(rows, played, strict=True):
        assert row["id"] == trajectory.trajectory_id
        roles = [m["role"] for m in row["messages"]]
        assert roles[:2] == ["system", "user"] and set(roles) == {"system", "user", "assistant"}
        actions = [m["content"][0]["text"] for m in row["messages"] if m["role"] == "assistant"]
        assert set(actions) <= {"up", "down", "left", "right", "stop"} and len(actions) == len(row["trained_turns"])
        detours += row["trained_turns"].count(False)
        assert [(tmp_path / "data" / name).read_bytes() for name in row["images"]] == list(trajectory.images)
        text = tokenizer.apply_chat_template(row["messages"], tokenize=False)
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == _collapse_images(
            trajectory.token_ids, chat.image_pad
        )
    assert detours > 0  # perturb_prob put untrained detour moves in, and they are flagged


def test_every_row_has_one_schema_as_an_arrow_table_needs(tiny_model_dir: Path, tmp_path: Path) -> None:
    """datasets (absent here) reads JSONL into one Arrow schema: the same keys, a content list of
    {type, text?} parts, string paths."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = SftConfig(base_model=str(tiny_model_dir), out=str(tmp_path / "unused"), num_tasks=2)
    played = play_expert(config, tokenizer)
    write_jsonl(played, tokenizer, tmp_path / "sft.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    for row in rows:
        assert set(row) == {"id", "messages", "images", "trained_turns"}
        assert all(isinstance(name, str) and (tmp_path / name).is_file() for name in row["images"])
        for message in row["messages"]:
            assert set(message) == {"role", "content"}
            for part in message["content"]:
                assert part == {"type": "image"} or (part["type"] == "text" and isinstance(part["text"], str))
