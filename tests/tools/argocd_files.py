"""Argo CD's resource customizations for FlowForge, from their one source: the Lua files
under ``deploy/argocd/flowforge.io/<Kind>/`` (Argo CD's own layout: ``health.lua``,
``actions/discovery.lua``, ``actions/<name>/action.lua``).

``python -m tests.tools.argocd_files`` writes what is made from them: the chart's copies
(``charts/flowforge/argocd/``, which ``templates/argocd-cm.yaml`` renders when
``argocd.resourceCustomizations.enabled``) and ``deploy/argocd/argocd-cm.yaml`` (the keys
to merge into ``argocd-cm`` by hand). ``tests/unit/test_argocd_lua.py`` fails while either
is stale.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "deploy" / "argocd"
GROUP = "flowforge.io"
CHART_COPY = ROOT / "charts" / "flowforge" / "argocd"
CONFIG_MAP = SOURCE / "argocd-cm.yaml"


def lua_files() -> dict[str, str]:
    """Every Lua file by its path under deploy/argocd/."""
    return {
        str(path.relative_to(SOURCE)): path.read_text() for path in sorted(SOURCE.rglob("*.lua"))
    }


def customizations() -> dict[str, str]:
    """The ``argocd-cm`` data keys: a health check per kind, actions where a kind has some."""
    data: dict[str, str] = {}
    for kind_dir in sorted((SOURCE / GROUP).iterdir()):
        key = f"{GROUP}_{kind_dir.name}"
        health = kind_dir / "health.lua"
        if health.exists():
            data[f"resource.customizations.health.{key}"] = health.read_text()
        actions = kind_dir / "actions"
        if actions.exists():
            definitions = [
                {"name": path.parent.name, "action.lua": path.read_text()}
                for path in sorted(actions.glob("*/action.lua"))
            ]
            body = {
                "discovery.lua": (actions / "discovery.lua").read_text(),
                "definitions": definitions,
            }
            data[f"resource.customizations.actions.{key}"] = _dump(body)
    return data


def config_map() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "argocd-cm",
            "namespace": "argocd",
            "labels": {"app.kubernetes.io/part-of": "argocd"},
        },
        "data": customizations(),
    }


def _literal(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(str, _literal)


def _dump(value: Any) -> str:
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, width=1000)


def main() -> None:
    if CHART_COPY.exists():
        shutil.rmtree(CHART_COPY)
    for relative, text in lua_files().items():
        target = CHART_COPY / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    header = (
        "# Argo CD resource customizations for FlowForge: merge these keys into argocd-cm\n"
        "# (made from the Lua files beside this one: python -m tests.tools.argocd_files)\n"
    )
    CONFIG_MAP.write_text(header + _dump(config_map()))
    print(f"wrote {CHART_COPY} and {CONFIG_MAP}")


if __name__ == "__main__":
    main()
