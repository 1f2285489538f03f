"""Shared by the node tests that drive a partition in-process."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(cond: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    """Wait until `cond()` holds, polling every 10 ms; fails naming `what` after `timeout`."""
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{what} did not happen within {timeout:g} s")
