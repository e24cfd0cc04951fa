"""The tests' Go programs, built (once, cached) by ``tests/tools/gotools/build.sh``.

A missing Go toolchain or a failed build is a test failure with the build's own message,
never a skip: these tools are how the tests see what kstatus and Argo CD's Lua VM see.
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

BUILD = Path(__file__).resolve().parent / "gotools" / "build.sh"


@functools.cache
def go_tool(name: str) -> Path:
    """The path of the built tool ``name`` (built now when its sources changed)."""
    done = subprocess.run(
        ["bash", str(BUILD), name], capture_output=True, text=True, timeout=1200, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"building the {name} Go tool failed:\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def kstatus(objects: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """kstatus' ``status.Compute`` of each object, in order."""
    done = subprocess.run(
        [str(go_tool("kstatus"))],
        input=json.dumps(list(objects)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


def argocd_lua(script: Path, objects: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What an Argo CD Lua script returns for each object, run in gopher-lua (Argo CD's VM,
    with the libraries Argo CD opens): ``{"result": ...}`` or ``{"error": ...}``."""
    done = subprocess.run(
        [str(go_tool("luahealth")), str(script)],
        input=json.dumps(list(objects)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]
