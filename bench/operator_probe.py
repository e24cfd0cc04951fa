"""The operator (``python -m flowforge.operator``) with a memory probe, for
``bench_memory.py --probe DIR``: on SIGUSR1 it writes ``DIR/probe-N.json``: after a full
collection, the live objects the garbage collector tracks, counted by type, and (when
started with ``-X tracemalloc``) a tracemalloc snapshot ``DIR/probe-N.snapshot``.

Usage: python bench/operator_probe.py DIR [operator flags...]
"""

from __future__ import annotations

import collections
import gc
import json
import runpy
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType


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

    signal.signal(signal.SIGUSR1, dump)
    sys.argv = ["flowforge.operator", *sys.argv[2:]]
    runpy.run_module("flowforge.operator", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
