"""The schedule a definition implies: forward order, levels, and who compensates whom."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from flowforge.domain.models import DefinitionSpec


@dataclass(frozen=True, slots=True)
class Plan:
    """``order``: every forward task after its dependencies (ties by key); ``levels``: tasks
    grouped by depth; ``compensation``: forward key -> its compensator's key, by forward key."""

    order: tuple[str, ...]
    levels: tuple[tuple[str, ...], ...]
    compensation: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def to_dict(self) -> dict[str, Any]:
        return {
            "order": list(self.order),
            "levels": [list(level) for level in self.levels],
            "compensation": dict(self.compensation),
        }


def plan(spec: DefinitionSpec) -> Plan:
    """The plan of a valid definition (CyclicDependencyError if its graph has a cycle)."""
    graph = spec.graph
    compensation = {
        forward: compensator.key for forward, compensator in sorted(spec.compensators.items())
    }
    return Plan(
        order=graph.topological_order(),
        levels=graph.levels(),
        compensation=MappingProxyType(compensation),
    )
