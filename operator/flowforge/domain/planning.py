"""The schedule a run of a definition implies: forward order, levels, who compensates whom,
and, for the run's parameters, which tasks their condition skips (`expansion.py`: the same
expansion the operator writes when it creates the run)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from flowforge.domain.expansion import CONDITION_FALSE, compensator_rows, expand
from flowforge.domain.models import DefinitionSpec


@dataclass(frozen=True, slots=True)
class Plan:
    """``order``: every forward task after its dependencies (ties by key); ``levels``: tasks
    grouped by depth (a forEach task's instances ``task[item]`` in its place);
    ``compensation``: forward key -> its compensator's key (per instance), by forward key;
    ``skipped``: the tasks whose condition is false -> their ``when`` (in no level: they run
    nothing); ``parameters``: the run's effective parameters."""

    order: tuple[str, ...]
    levels: tuple[tuple[str, ...], ...]
    compensation: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    skipped: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    parameters: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def to_dict(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "order": list(self.order),
            "levels": [list(level) for level in self.levels],
            "compensation": dict(self.compensation),
        }
        if self.parameters:
            document["parameters"] = dict(self.parameters)
        if self.skipped:
            document["skipped"] = [
                {"task": key, "reason": CONDITION_FALSE, "when": when}
                for key, when in self.skipped.items()
            ]
        return document


def plan(spec: DefinitionSpec, parameters: Mapping[str, Any] | None = None) -> Plan:
    """The plan of a run of a valid definition with ``parameters`` (its ``spec.parameters``;
    none: the defaults). ParameterError or ConditionError when the run would be refused."""
    expansion = expand(spec, parameters or {})
    graph = expansion.graph
    compensation = {
        forward: compensator
        for forward, compensator in sorted(compensator_rows(spec, expansion).items())
        if expansion.runs(forward) and forward not in expansion.empty
    }
    return Plan(
        order=graph.topological_order(),
        levels=graph.levels(),
        compensation=MappingProxyType(compensation),
        skipped=MappingProxyType(
            {key: str(spec.task(key).when) for key in sorted(expansion.skipped)}
        ),
        parameters=expansion.parameters,
    )
