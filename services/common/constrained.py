"""Constrained actions (`sampling.actions: constrained`): generation restricted to the env's action
words, every log-prob renormalised over the tokens allowed where it was generated. Defined once here;
the rollout engine samples and scores with it, the learner rebuilds it from the same sequences.

The mask is a set of token sequences, each action word's tokens followed by the end-of-turn token
(<|im_end|>, allowed only after a complete word). At a generated position the allowed tokens are the
ones that continue one of the sequences from the tokens generated so far in the turn:

    A(prefix) = { s[len(prefix)] : s in sequences, s starts with prefix, len(s) > len(prefix) }

and the log-prob of token x there is the masked, renormalised one:

    log pi_A(x | prefix) = z_x - logsumexp_{a in A(prefix)} z_a        (z: logits, or log-probs)

A one-token word is one masked position (then <|im_end|>); a longer word a prefix mask per position.
With the same sequences and the same logits, both sides compute the same number, so the PPO ratio, its
clip and the KL stay exact under the constraint.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


class _Encoder(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass(frozen=True)
class ActionMask:
    """The allowed token sequences of one run (each word's tokens, then the end-of-turn token)."""

    sequences: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if not self.sequences or any(len(s) < 2 for s in self.sequences):
            raise ValueError("an action mask needs sequences of a word's tokens and the end-of-turn token")
        if len(set(self.sequences)) != len(self.sequences):
            raise ValueError("two action words have the same tokens")

    @classmethod
    def from_words(cls, tokenizer: _Encoder, words: Iterable[str], end_token_id: int) -> ActionMask:
        """The mask of `words` as `tokenizer` writes them, each closed by `end_token_id`."""
        return cls(tuple((*tokenizer.encode(word, add_special_tokens=False), end_token_id) for word in words))

    @property
    def tokens(self) -> tuple[int, ...]:
        """Every token any position may allow, sorted."""
        return tuple(sorted({t for s in self.sequences for t in s}))

    @property
    def longest(self) -> int:
        """Tokens of the longest sequence, end-of-turn included."""
        return max(len(s) for s in self.sequences)

    def allowed(self, prefix: Sequence[int]) -> tuple[int, ...]:
        """The tokens that may follow `prefix` (the turn's generated tokens so far), sorted; () once a
        sequence is complete or when `prefix` continues none."""
        return _allowed(self.sequences, tuple(prefix))

    def renormalised(self, prefix: Sequence[int], token: int, logprobs: Mapping[int, float]) -> float:
        """log pi_A(token | prefix) from unmasked log-probs (or logits) of at least the allowed tokens."""
        allowed = self.allowed(prefix)
        if token not in allowed:
            raise ValueError(f"token {token} is not allowed after {list(prefix)} (allowed: {list(allowed)})")
        values = [logprobs[t] for t in allowed]
        top = max(values)
        return logprobs[token] - (top + math.log(sum(math.exp(v - top) for v in values)))

    def to_lists(self) -> list[list[int]]:
        return [list(s) for s in self.sequences]


@functools.lru_cache(maxsize=4096)
def _allowed(sequences: tuple[tuple[int, ...], ...], prefix: tuple[int, ...]) -> tuple[int, ...]:
    n = len(prefix)
    return tuple(sorted({s[n] for s in sequences if len(s) > n and s[:n] == prefix}))


def generated_prefixes(token_ids: Sequence[int], loss_mask: Sequence[int]) -> list[tuple[int, ...] | None]:
    """For each position, the tokens generated before it in its turn (a maximal run of loss mask 1) when
    it is generated, else None: what `ActionMask.allowed` is asked at each position of a trajectory."""
    out: list[tuple[int, ...] | None] = []
    start = 0
    for i, generated in enumerate(loss_mask):
        if not generated:
            out.append(None)
            start = i + 1
        else:
            out.append(tuple(token_ids[start:i]))
    return out
