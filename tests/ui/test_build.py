"""The UI committed into the package is exactly what its sources and lockfile build.

`make ui` writes `operator/flowforge/server/static/`; this test builds again into a temporary
folder and compares every file byte for byte, so the committed build can never drift from
`ui/` (a changed source without a rebuild fails here, naming the files)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UI = ROOT / "ui"
STATIC = ROOT / "operator" / "flowforge" / "server" / "static"


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_committed_build_is_what_the_sources_build(tmp_path: Path) -> None:
    node = shutil.which("node")
    assert node, "node is not on PATH: install Node.js 20 (the UI builds with it)"
    assert (UI / "node_modules" / ".installed").exists(), (
        "ui/node_modules is missing: run `make ui` (npm ci from ui/package-lock.json)"
    )
    out = tmp_path / "static"
    built = subprocess.run(
        # `npm run build` also type-checks; the bytes come from Vite alone.
        [node, "node_modules/vite/bin/vite.js", "build"],
        cwd=UI,
        env={**os.environ, "FLOWFORGE_UI_OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert built.returncode == 0, f"the UI build failed:\n{built.stdout}\n{built.stderr}"
    fresh, committed = _tree(out), _tree(STATIC)
    assert "index.html" in fresh
    assert any(name.endswith(".js") for name in fresh), fresh.keys()
    differing = sorted(
        name for name in fresh.keys() | committed.keys() if fresh.get(name) != committed.get(name)
    )
    assert not differing, (
        f"operator/flowforge/server/static differs from a fresh build in {differing}: "
        "run `make ui` and commit the result"
    )


def test_the_build_loads_nothing_from_outside() -> None:
    """No CDN fonts, scripts or styles: the only URLs in the bundle are XML namespaces."""
    allowed = ("http://www.w3.org/",)
    for name, content in _tree(STATIC).items():
        urls = re.findall(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}[^\s\"'`)]*", content.decode())
        outside = [url for url in urls if not url.startswith(allowed)]
        assert not outside, f"{name} refers to outside addresses: {outside[:5]}"


def test_the_api_types_are_generated_from_the_openapi_document(tmp_path: Path) -> None:
    """`ui/src/api-schema.ts` is what openapi-typescript makes of `docs/openapi.json` (itself
    checked against the server's models by tests/unit/test_server_api_document.py), so the UI's
    types cannot drift from what the API serves."""
    node = shutil.which("node")
    assert node, "node is not on PATH: install Node.js 20 (the UI builds with it)"
    assert (UI / "node_modules" / ".installed").exists(), (
        "ui/node_modules is missing: run `make ui` (npm ci from ui/package-lock.json)"
    )
    out = tmp_path / "api-schema.ts"
    generated = subprocess.run(
        [
            node,
            "node_modules/openapi-typescript/bin/cli.js",
            "../docs/openapi.json",
            "-o",
            str(out),
        ],
        cwd=UI,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert generated.returncode == 0, f"openapi-typescript failed:\n{generated.stderr}"
    assert out.read_text() == (UI / "src" / "api-schema.ts").read_text(), (
        "ui/src/api-schema.ts is not what docs/openapi.json generates: run "
        "`npm run --prefix ui api-types` and commit the result"
    )
