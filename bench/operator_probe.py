"""The operator (``python -m flowforge.operator``) with a memory probe, for
``bench_memory.py --probe DIR``: on SIGUSR1 it writes ``DIR/probe-N.json``: after a full
collection, the live objects the garbage collector tracks, counted by type, and (when
started with ``-X tracemalloc``) a tracemalloc snapshot ``DIR/probe-N.snapshot``. On SIGUSR2
it writes ``DIR/trim.json``: the RSS before and after glibc's ``malloc_trim(0)`` (how much of
it is freed heap not given back to the system).

Usage: python bench/operator_probe.py DIR [operator flags...]
"""

from __future__ import annotations

import collections
import ctypes
import gc
import json
import runpy
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    directory = Path(sys.argv[1])
    directory.mkdir(parents=True, exist_ok=True)
    taken = [0]

    def dump(signum: int, frame: FrameType | None) -> None:
        number = taken[0]
        taken[0] += 1
        gc.collect()
        counts = collections.Counter(
            f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects()
        )
        (directory / f"probe-{number}.json").write_text(json.dumps(dict(counts)))
        if tracemalloc.is_tracing():
            tracemalloc.take_snapshot().dump(str(directory / f"probe-{number}.snapshot"))
        (directory / f"probe-{number}.done").touch()

    def trim(signum: int, frame: FrameType | None) -> None:
        before = rss_kib()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        figures = {"before": before, "after": rss_kib()}
        (directory / "trim.json").write_text(json.dumps(figures))

    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGUSR2, trim)
    sys.argv = ["flowforge.operator", *sys.argv[2:]]
    runpy.run_module("flowforge.operator", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
