"""The constrained actions' mask (services/common/constrained.py): which tokens may come next, and
log-probs renormalised over them, computed by hand."""

from __future__ import annotations

import math

import pytest

from services.common.constrained import ActionMask, generated_prefixes

END = 2
MASK = ActionMask(((10, END), (11, END), (12, 13, 14, END), (12, 15, END)))  # "left", "right", two words from 12


def test_each_position_allows_the_tokens_that_continue_a_word_and_the_end_only_after_a_whole_word() -> None:
    assert MASK.allowed(()) == (10, 11, 12)
    assert MASK.allowed((12,)) == (13, 15)
    assert MASK.allowed((12, 13)) == (14,)
    assert MASK.allowed((12, 13, 14)) == (END,)
    assert MASK.allowed((10,)) == (END,)
    assert MASK.allowed((10, END)) == () and MASK.allowed((99,)) == ()
    assert MASK.tokens == (END, 10, 11, 12, 13, 14, 15) and MASK.longest == 4


def test_a_log_prob_is_renormalised_over_the_allowed_tokens() -> None:
    logprobs = {10: math.log(0.1), 11: math.log(0.3), 12: math.log(0.1), 99: math.log(0.5)}
    assert MASK.renormalised((), 11, logprobs) == pytest.approx(math.log(0.3 / 0.5))
    assert MASK.renormalised((12, 13), 14, {14: -3.0}) == 0.0  # the only allowed token is certain
    with pytest.raises(ValueError, match="not allowed"):
        MASK.renormalised((), 99, logprobs)


def test_words_become_their_tokens_then_the_end_and_alike_words_are_refused() -> None:
    class Letters:
        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [ord(c) for c in text]

    assert ActionMask.from_words(Letters(), ["ab", "c"], END).sequences == ((97, 98, END), (99, END))
    with pytest.raises(ValueError, match="same tokens"):
        ActionMask.from_words(Letters(), ["ab", "ab"], END)


def test_the_prefix_of_a_position_is_what_its_turn_generated_before_it() -> None:
    ids = [5, 6, 12, 13, 14, 2, 7, 10, 2]
    mask = [0, 0, 1, 1, 1, 1, 0, 1, 1]
    assert generated_prefixes(ids, mask) == [None, None, (), (12,), (12, 13), (12, 13, 14), None, (), (10,)]
