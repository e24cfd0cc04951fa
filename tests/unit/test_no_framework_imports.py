"""flowforge.domain imports no framework: checked statically and by a real import."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

FORBIDDEN = ("kopf", "kubernetes", "psycopg", "psycopg_pool")
OPERATOR = Path(__file__).parents[2] / "operator"
DOMAIN = OPERATOR / "flowforge" / "domain"


def _forbidden(module: str) -> bool:
    return module.split(".")[0] in FORBIDDEN


def test_no_domain_module_imports_a_framework() -> None:
    offences: list[str] = []
    files = sorted(DOMAIN.rglob("*.py"))
    assert files, f"no Python files found under {DOMAIN}"
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute | ast.Name)
                and getattr(node.func, "attr", getattr(node.func, "id", ""))
                in ("import_module", "__import__")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                modules = [node.args[0].value]
            else:
                continue
            offences.extend(
                f"{path.relative_to(OPERATOR)}:{node.lineno} imports {module}"
                for module in modules
                if _forbidden(module)
            )
    assert offences == []


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
