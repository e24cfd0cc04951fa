"""The operator gives freed heap back to the system (glibc's malloc_trim): a heap left
fragmented by many freed allocations shrinks in RSS once released."""

from __future__ import annotations

import gc
from pathlib import Path

from flowforge.operator.memory import release_free_memory


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_freed_heap_is_given_back() -> None:
    # 40 MiB of allocations too big for Python's own small-object arenas (glibc's heap),
    # one in a hundred kept: the heap keeps its size, its pages mostly free
    blocks = [bytearray(800) for _ in range(50_000)]
    kept = blocks[::100]
    del blocks
    gc.collect()
    before = _rss_mib()
    assert release_free_memory()  # our machines and the image are glibc
    after = _rss_mib()
    assert before - after > 20, f"RSS {before:.1f} MiB -> {after:.1f} MiB"
    assert len(kept) == 500
