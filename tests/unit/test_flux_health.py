"""The Flux ``healthCheckExprs`` documented in docs/gitops.md, evaluated with a CEL library
(``cel``) the way Flux's CEL status reader does, against the recorded status bodies of
every phase (tests/data/status/)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cel
import pytest
import yaml

from tests.tools.status_bodies import EXPECTED, recorded

DOC = Path(__file__).resolve().parents[2] / "docs" / "gitops.md"
MARKER = "<!-- flux-health-check-exprs:"


def documented_exprs() -> dict[str, dict[str, str]]:
    """The Kustomization's healthCheckExprs from the docs' marked YAML block, by kind."""
    text = DOC.read_text()
    block = text[text.index(MARKER) :].split("```yaml\n", 1)[1].split("```", 1)[0]
    kustomization = yaml.safe_load(block)
    return {entry["kind"]: entry for entry in kustomization["spec"]["healthCheckExprs"]}


def flux_status(obj: Mapping[str, Any], exprs: Mapping[str, str]) -> str:
    """Flux's CEL status reader (RFC-0009): a status made for an older generation is in
    progress; then inProgress, failed and current, in this order, the first that holds
    decides; none: in progress. An expression that cannot be evaluated (no status yet)
    keeps Flux waiting: in progress."""
    observed = (obj.get("status") or {}).get("observedGeneration")
    if observed is not None and observed != obj["metadata"].get("generation"):
        return "InProgress"
    variables = {key: obj[key] for key in ("metadata", "spec", "status") if key in obj}
    for key, verdict in (
        ("inProgress", "InProgress"),
        ("failed", "Failed"),
        ("current", "Current"),
    ):
        if key not in exprs:
            continue
        try:
            holds = cel.evaluate(exprs[key], variables)
        except RuntimeError:
            return "InProgress"
        assert isinstance(holds, bool), f"{key} of {obj['kind']} is not a boolean"
        if holds:
            return verdict
    return "InProgress"


def test_every_recorded_object_is_judged_as_expected() -> None:
    exprs = documented_exprs()
    assert set(exprs) == {"WorkflowRun", "WorkflowDefinition"}
    assert all(entry["apiVersion"] == "flowforge.io/v1alpha1" for entry in exprs.values())
    seen = {stem: flux_status(obj, exprs[obj["kind"]]) for stem, obj in recorded().items()}
    assert seen == {stem: verdict.flux for stem, verdict in EXPECTED.items()}


@pytest.mark.parametrize("kind", ["WorkflowRun", "WorkflowDefinition"])
def test_an_object_without_a_status_cannot_pass_as_current(kind: str) -> None:
    exprs = documented_exprs()[kind]
    bare = {"metadata": {"name": "x", "generation": 1}, "spec": {}}
    for key in ("failed", "current"):
        with pytest.raises(RuntimeError):
            cel.evaluate(exprs[key], bare)
    assert flux_status({**bare, "kind": kind}, exprs) == "InProgress"
