"""Tolerant parsing of a model's action text into one of up, down, left, right, stop (the move words of
grid environments: the maze reads all five, Sokoban the four directions), or into any environment's own
action words (`word_parser`, e.g. a Gymnasium environment's).

Rules, applied in order:
1. Closed `<think>...</think>` blocks are dropped (reasoning is not the answer).
2. If an `<answer>` tag is present, only the text of the last one counts (up to its `</answer>`, or
   to the end when it is not closed).
3. The action is the last action word in that text, matched as a whole word, case-insensitively:
   up/down/left/right/stop, or the compass words north/south/west/east for up/down/left/right.
   Punctuation, quotes, markdown and surrounding words are ignored ("Move **Down**." -> down).
4. No action word: the text is invalid (None). Invalid text is not an error; the episode charges it a
   move and says "Invalid action."
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal, cast

from services.env.kit.grid import DIRECTIONS, STOP

Action = Literal["up", "down", "left", "right", "stop"]
WORDS: tuple[str, ...] = (*DIRECTIONS, STOP)

SYNONYMS: dict[str, Action] = {"north": "up", "south": "down", "west": "left", "east": "right"}

_THINK = re.compile(r"<think>.*?</think>", re.IGNORECASE | re.DOTALL)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
_ANSWER_OPEN = re.compile(r"<answer>", re.IGNORECASE)
_ANSWER_CLOSE = re.compile(r"</answer>", re.IGNORECASE)
# Whole words only: "upward", "stopped" or "Right-hand" letters around a word do not count.
_WORD = re.compile(
    r"(?<![a-z0-9])(" + "|".join([*WORDS, *SYNONYMS]) + r")(?![a-z0-9])", re.IGNORECASE
)


def answer_span(text: str) -> str:
    """The part of `text` that holds the answer (rules 1 and 2 above)."""
    if "<" not in text:
        return text
    # Only up to the last </think>: `<think>` openings after it cannot start a block, and searching
    # from each of them for a close that never comes made a long action quadratic.
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:
        end = closes[-1].end()
        text = _THINK.sub(" ", text[:end]) + text[end:]
    opens = list(_ANSWER_OPEN.finditer(text))
    if not opens:
        return text
    tail = text[opens[-1].end():]
    close = _ANSWER_CLOSE.search(tail)
    return tail if close is None else tail[: close.start()]


def parse_action(text: str) -> Action | None:
    """The action in `text` ("up", "down", "left", "right" or "stop"), or None when there is none."""
    matches = _WORD.findall(answer_span(text))
    if not matches:
        return None
    word = matches[-1].lower()
    return SYNONYMS.get(word, cast(Action, word))


def word_parser(words: tuple[str, ...]) -> Callable[[str], str | None]:
    """A parser of any environment's action words by rules 1-4 above (no synonyms): the last of
    `words` in the text's answer, matched whole and case-insensitively, or None."""
    pattern = re.compile(r"(?<![a-z0-9])(" + "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
                         + r")(?![a-z0-9])", re.IGNORECASE)
    canonical = {w.lower(): w for w in words}

    def parse(text: str) -> str | None:
        matches = pattern.findall(answer_span(text))
        return canonical[matches[-1].lower()] if matches else None

    return parse
