"""Polling for a condition that another process makes true (a service starting, Redis answering)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def poll_until(check: Callable[[], Awaitable[bool]], timeout_s: float, poll_s: float) -> bool:
    """Awaits `check()` every `poll_s` seconds until it returns True (then True) or `timeout_s` has
    passed (then False). `check` runs at least once, even with a timeout of 0."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll_s)
    return True
