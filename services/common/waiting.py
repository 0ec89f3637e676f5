"""Polling for a condition that another process makes true (a service starting, Redis answering)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def poll_until(check: Callable[[], Awaitable[bool]], timeout_s: float, poll_s: float,
                     max_poll_s: float | None = None) -> bool:
    """Awaits `check()` every `poll_s` seconds until it returns True (then True) or `timeout_s` has
    passed (then False). `check` runs at least once, even with a timeout of 0. With `max_poll_s`
    the interval doubles after each miss up to that cap (backoff for long outages)."""
    deadline = time.monotonic() + timeout_s
    interval = poll_s
    while not await check():
        now = time.monotonic()
        if now >= deadline:
            return False
        await asyncio.sleep(min(interval, max(deadline - now, 0.0)))
        if max_poll_s is not None:
            interval = min(interval * 2, max_poll_s)
    return True
