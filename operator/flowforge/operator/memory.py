"""Giving freed heap memory back to the system.

glibc's allocator keeps what Python frees in its arenas, to serve later allocations; pages
in the middle of an arena are not returned until ``malloc_trim`` asks, so a process's RSS
stays at its high-water mark after a burst of runs (bench/bench_memory.py). Every
``TRIM_SECONDS`` the operator asks glibc to return its free pages, from a thread (the call
locks the arenas, not the event loop). Elsewhere than glibc (e.g. musl) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

TRIM_SECONDS = 30.0


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim: Callable[[int], int] | None = getattr(ctypes.CDLL(name), "malloc_trim", None)
    return trim


def release_free_memory() -> bool:
    """Return the allocator's free pages to the system; False where it cannot (no glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


async def release_periodically(interval: float = TRIM_SECONDS) -> None:
    if _malloc_trim() is None:
        logger.info("no malloc_trim here (not glibc): freed heap is left to the allocator")
        return
    while True:
        await asyncio.sleep(interval)
        await asyncio.to_thread(release_free_memory)
