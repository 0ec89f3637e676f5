"""The size-bounded least-recently-used map under the learner's and the rollout service's caches."""

from __future__ import annotations

import pytest

from services.common.lru import SizedLRU


def test_the_least_recently_used_values_leave_until_a_new_one_fits() -> None:
    lru: SizedLRU[str, str] = SizedLRU(6, len)
    lru.put("a", "aa")
    lru.put("b", "bb")
    assert lru.get("a") == "aa"  # b is now the least recently used
    lru.put("c", "cccc")
    assert (lru.get("b"), lru.get("a"), lru.get("c")) == (None, "aa", "cccc")
    assert (len(lru), lru.num_bytes) == (2, 6)


def test_a_value_put_again_is_counted_once_and_one_larger_than_the_budget_is_not_kept() -> None:
    lru: SizedLRU[str, str] = SizedLRU(6, len)
    lru.put("a", "aa")
    lru.put("a", "aaa")
    assert (len(lru), lru.num_bytes, lru.get("a")) == (1, 3, "aaa")
    lru.put("big", "x" * 7)
    assert (len(lru), lru.num_bytes, lru.get("big")) == (1, 3, None)
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        SizedLRU(-1, len)
