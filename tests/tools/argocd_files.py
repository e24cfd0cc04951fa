"""Argo CD's resource customizations for FlowForge, from their one source: the Lua files
under ``charts/flowforge/argocd/flowforge.io/<Kind>/`` (Argo CD's own layout:
``health.lua``, ``actions/discovery.lua``, ``actions/<name>/action.lua``), inside the chart
because a chart reads only its own files (``templates/argocd-cm.yaml`` renders them when
``argocd.resourceCustomizations.enabled``).

``python -m tests.tools.argocd_files`` writes what is made from them for installs without
the chart: ``deploy/argocd/argocd-cm.yaml`` (the keys to merge into ``argocd-cm`` by hand).
``tests/unit/test_argocd_lua.py`` fails while it is stale, or while a Lua file stands
anywhere else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "charts" / "flowforge" / "argocd"
GROUP = "flowforge.io"
CONFIG_MAP = ROOT / "deploy" / "argocd" / "argocd-cm.yaml"


def lua_files() -> dict[str, str]:
    """Every Lua file by its path under the chart's argocd/ (as the template reads it)."""
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


HEADER = (
    "# Argo CD resource customizations for FlowForge: merge these keys into argocd-cm\n"
    "# (made from the chart's Lua files, charts/flowforge/argocd/: do not edit here, run\n"
    "# python -m tests.tools.argocd_files)\n"
)


def main() -> None:
    CONFIG_MAP.write_text(HEADER + _dump(config_map()))
    print(f"wrote {CONFIG_MAP}")


if __name__ == "__main__":
    main()
