"""The ``flowforge`` command as a user runs it: a fresh interpreter importing this checkout's
``flowforge`` (its ``operator/`` first on the path), its output captured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]


def python(
    *arguments: str, cwd: Path = REPOSITORY, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """``python <arguments>`` with this checkout's ``flowforge`` importable."""
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY / "operator")}
    return subprocess.run(
        [sys.executable, *arguments],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def flowforge(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``flowforge <arguments>`` in ``cwd`` (a minute at most)."""
    return python("-m", "flowforge.cli.main", *arguments, cwd=cwd, timeout=60)
