"""YAML for GitOps repositories that Kubernetes reads back as exactly the same JSON.

PyYAML quotes the strings that YAML 1.1 would read as something else, but the API server
reads YAML with go-yaml v2, whose rules differ (``0o17`` is an integer there, for one). Any
string that either reader would not read back as itself is written double-quoted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from flowforge.domain.manifests import resolve_plain_scalar


class _ManifestDumper(yaml.SafeDumper):
    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        # lists indented under their key, as kubectl and most GitOps repositories write them
        super().increase_indent(flow, False)


def _represent_text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    resolved = resolve_plain_scalar(text) if text else None
    style = None if isinstance(resolved, str) and resolved == text else '"'
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_ManifestDumper.add_representer(str, _represent_text)


def to_yaml(documents: Iterable[Mapping[str, Any]]) -> str:
    """A multi-document YAML stream of ``documents``, keys in their given order."""
    return yaml.dump_all(
        [dict(document) for document in documents],
        Dumper=_ManifestDumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        explicit_start=True,
    )


def yaml_document(data: Any) -> str:
    """``data`` as one YAML document without ``---``, as ``kubectl -o yaml`` prints."""
    return yaml.dump(
        data,
        Dumper=_ManifestDumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
    )
