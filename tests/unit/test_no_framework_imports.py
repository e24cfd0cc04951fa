"""flowforge.domain imports with no framework installed: checked by a real import.

The static rule (no ``import kopf`` / ``kubernetes`` / ``psycopg`` in the domain, directly or
through another flowforge module) is an import-linter contract in pyproject.toml, run by
``make lint``. What it cannot see, and this test does: an import made at run time
(``importlib.import_module``), or one made inside a third-party package the domain uses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FORBIDDEN = ("kopf", "kubernetes", "psycopg", "psycopg_pool")
OPERATOR = Path(__file__).parents[2] / "operator"


BLOCKER = """
import importlib, pkgutil, sys
FORBIDDEN = {forbidden!r}

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in FORBIDDEN:
            raise ImportError(f"{{name}} is blocked: flowforge.domain must not import it")
        return None

sys.meta_path.insert(0, Blocker())
for name in list(sys.modules):
    if name.split(".")[0] in FORBIDDEN:
        del sys.modules[name]

import flowforge.domain
names = ["flowforge.domain"] + [
    f"flowforge.domain.{{info.name}}"
    for info in pkgutil.iter_modules(flowforge.domain.__path__)
]
for name in names:
    importlib.import_module(name)
loaded = sorted(name for name in sys.modules if name.split(".")[0] in FORBIDDEN)
assert not loaded, loaded
print(len(names))
"""


def test_the_domain_imports_with_the_frameworks_made_unimportable() -> None:
    environment = {**os.environ, "PYTHONPATH": str(OPERATOR)}
    result = subprocess.run(
        [sys.executable, "-c", BLOCKER.format(forbidden=FORBIDDEN)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.strip()) >= 10  # the package and every submodule were imported


def test_the_blocker_really_blocks() -> None:
    script = BLOCKER.format(forbidden=FORBIDDEN).replace(
        "import flowforge.domain\n", "import flowforge.domain\nimport kopf\n", 1
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(OPERATOR)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "kopf is blocked" in result.stderr
