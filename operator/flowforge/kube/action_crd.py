"""The WorkflowRunAction CRD (short name ``wfa``): a person's decision about a run.

Generated with the other CRDs by `python -m flowforge.kube.crdgen` from the domain's schema
(`flowforge.domain.run_actions`). An action is immutable once created (a CEL rule on the
spec); its status (who asked, the result) is written by FlowForge only.
"""

from __future__ import annotations

from typing import Any

from flowforge.domain.run_actions import KIND, PLURAL, SHORT_NAME, SPEC_SCHEMA, STATUS_SCHEMA
from flowforge.kube.structural import column, crd, resource_schema, to_structural

Schema = dict[str, Any]


def workflow_run_action_crd() -> Schema:
    spec = to_structural(SPEC_SCHEMA)
    spec["x-kubernetes-validations"] = [
        {"rule": "self == oldSelf", "message": "an action is immutable: create a new one"}
    ]
    schema = resource_schema(
        kind=KIND,
        description="A person's decision about a WorkflowRun of the namespace: approve or "
        "reject a gate, retry or skip a halted compensator, pause or resume. The operator "
        "processes it once and sets its result; the webhook records who asked.",
        spec=spec,
        status=to_structural(STATUS_SCHEMA),
    )
    columns = [
        column("Run", "string", ".spec.run", "The WorkflowRun the action is about."),
        column("Action", "string", ".spec.action", "What was asked."),
        column("Actor", "string", ".status.actor.username", "Who asked."),
        column("Result", "string", ".status.result", "Accepted or Refused."),
        column("Age", "date", ".metadata.creationTimestamp", "Time since creation."),
    ]
    return crd(kind=KIND, plural=PLURAL, short_name=SHORT_NAME, schema=schema, columns=columns)
