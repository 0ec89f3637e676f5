"""Action texts are parsed tolerantly into up/down/left/right/stop, or None."""

from __future__ import annotations

import pytest

from services.env.kit.actions import WORDS as ACTIONS
from services.env.kit.actions import parse_action

TABLE = [
    ("up", "up"),
    ("DOWN", "down"),
    ("  Left\n", "left"),
    ("right.", "right"),
    ("Stop!", "stop"),
    ("'up'", "up"),
    ("**Down**", "down"),
    ("Action: RIGHT", "right"),
    ("I will move left.", "left"),
    ("<answer>down</answer>", "down"),
    ("<answer> Left </answer>", "left"),
    ("<ANSWER>up</ANSWER>", "up"),
    ("The wall blocks up, so <answer>right</answer>", "right"),
    ("<answer>up</answer> then <answer>down</answer>", "down"),
    ("<answer>left", "left"),
    ("<think>maybe up or left</think>down", "down"),
    ("<think>go left</think>", None),
    ("<think>unfinished thought, go up", "up"),
    ("not up, go down", "down"),
    ("north", "up"),
    ("South", "down"),
    ("west", "left"),
    ("EAST", "right"),
    ("move_up", "up"),
    ("up-left", "left"),
    ("upward", None),
    ("stopped", None),
    ("downstairs", None),
    ("rightmost", None),
    ("xyz", None),
    ("", None),
    ("   ", None),
    ("<answer></answer>", None),
    ("<answer>jump</answer> up", None),
    ("🙂 up 🙂", "up"),
    ("u", None),
]


@pytest.mark.parametrize(("text", "expected"), TABLE)
def test_action_text_parses_as_expected(text: str, expected: str | None) -> None:
    assert parse_action(text) == expected


def test_the_action_vocabulary_is_the_four_moves_and_stop() -> None:
    assert ACTIONS == ("up", "down", "left", "right", "stop")
