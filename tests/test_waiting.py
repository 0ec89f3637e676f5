"""poll_until: the coordinator's wait for its services and for Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from services.common.waiting import poll_until


def _check_true_from_call(n: int) -> tuple[list[int], Callable[[], Awaitable[bool]]]:
    calls: list[int] = []

    async def check() -> bool:
        calls.append(len(calls) + 1)
        return len(calls) >= n

    return calls, check


def test_it_polls_until_the_check_holds() -> None:
    calls, check = _check_true_from_call(3)
    assert asyncio.run(poll_until(check, timeout_s=5.0, poll_s=0.01)) is True
    assert len(calls) == 3


def test_it_gives_up_after_the_timeout_having_checked_at_least_once() -> None:
    calls, check = _check_true_from_call(10**9)
    assert asyncio.run(poll_until(check, timeout_s=0.0, poll_s=0.01)) is False
    assert len(calls) == 1
    calls.clear()
    assert asyncio.run(poll_until(check, timeout_s=0.1, poll_s=0.02)) is False
    assert 2 <= len(calls) <= 10
