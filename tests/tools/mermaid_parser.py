"""Mermaid's own parser, run by node, for tests that check Mermaid text by parsing it.

Install once (``make`` does it): ``npm ci --prefix tests/tools --no-audit --no-fund``.
Without it a test skips with that command, except under CI=true, where it fails: a check
that silently did not run is worse than a red build.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

TOOLS = Path(__file__).parent
SCRIPT = TOOLS / "mermaid_parse.mjs"
INSTALL_COMMAND = "npm ci --prefix tests/tools --no-audit --no-fund"


def parse_mermaid(texts: list[str]) -> list[dict[str, Any]]:
    """For each text, what Mermaid understood: ``{"ok": True, "diagramType", "direction",
    "vertices": [{"id", "text", "shape", "classes"}], "edges": [{"start", "end", "stroke",
    "text"}], "classes": {name: [style, ...]}}``, or ``{"ok": False, "error"}``."""
    node = shutil.which("node")
    missing = []
    if node is None:
        missing.append("node (Node.js >= 20) is not on PATH")
    if not (TOOLS / "node_modules" / "mermaid").is_dir():
        missing.append(f"the Mermaid parser is not installed: run `{INSTALL_COMMAND}`")
    if missing:
        # a rendering test that skips proves nothing: a missing parser is a failure
        pytest.fail("; ".join(missing))
    assert node is not None
    result = subprocess.run(
        [node, str(SCRIPT)],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"the Mermaid parser crashed: {result.stderr.strip()}")
    parsed: list[dict[str, Any]] = json.loads(result.stdout)
    assert len(parsed) == len(texts)
    return parsed
