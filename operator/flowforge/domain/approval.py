"""Approval gates: a task that waits for people instead of running a Job.

```yaml
- key: approve-prod
  dependsOn: [deploy-staging]
  approval: {approvers: {users: [alice], groups: [release-managers]}, required: 2,
             forbidSelf: true, timeoutSeconds: 86400, onTimeout: Reject}
```

Once its upstreams succeeded the gate is ``awaiting`` (``flowforge.domain.states``): no Job,
no attempt, the run ``Running`` with an ``AwaitingApproval`` condition naming it. People
decide with WorkflowRunActions: each ``Approve`` by a person the gate lets approve counts
once per person; ``required`` of them pass the gate (it succeeds and its dependents are
released as after any success); one ``Reject``, or the timeout, fails it for good (reasons
``Rejected``, ``ApprovalTimedOut``) and the run rolls back as for any failure. A cancel
always wins: the waiting gate is cancelled with the run. The rules a definition must keep
are :func:`gate_errors`; who may approve is :func:`approval_refusal`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from enum import StrEnum
from typing import Final

from flowforge.domain.errors import ApprovalGateError, DefinitionError, DefinitionSchemaError
from flowforge.domain.models import ApprovalSpec, DefinitionSpec, TaskSpec
from flowforge.domain.run_actions import Actor

# the fields of a task that only a Job has: a gate may set none of them
_JOB_FIELDS: Final = (
    ("type", "type"),
    ("config", "config"),
    ("retries", "retries"),
    ("timeout_seconds", "timeoutSeconds"),
    ("for_each", "forEach"),
    ("compensate_for", "compensateFor"),
    ("compensate_on", "compensateOn"),
)


class GateReason(StrEnum):
    """Why a gate failed (the task's failure reason, in its history and Events)."""

    REJECTED = "Rejected"
    TIMED_OUT = "ApprovalTimedOut"


def gate_errors(definition: DefinitionSpec) -> list[DefinitionError]:
    """The gate rules, in document order: a task has a ``type`` or an ``approval`` (one of
    them); a gate sets nothing only a Job has, has no compensator, and does not require
    more approvals than its approvers can give."""
    gates = {task.key for task in definition.tasks if task.is_gate}
    errors: list[DefinitionError] = []
    for index, task in enumerate(definition.tasks):
        where = f"spec.tasks[{index}]"
        if task.approval is None:
            if task.type is None:
                errors.append(
                    DefinitionSchemaError(
                        f'task "{task.key}" needs a type (or an approval, to be an approval gate)',
                        path=f"{where}.type",
                    )
                )
            elif task.compensate_for in gates:
                errors.append(
                    ApprovalGateError(
                        f'task "{task.key}" compensates "{task.compensate_for}", an approval '
                        "gate: a gate runs no work, there is nothing to undo",
                        path=f"{where}.compensateFor",
                    )
                )
            continue
        errors.extend(_own_errors(task, where=where))
    return errors


def _own_errors(task: TaskSpec, *, where: str) -> Iterator[DefinitionError]:
    approval = task.approval
    assert approval is not None
    for attribute, field in _JOB_FIELDS:
        value = getattr(task, attribute)
        if value is not None and value != {} and not (attribute == "retries" and value == 0):
            yield ApprovalGateError(
                f'task "{task.key}" is an approval gate: {field} belongs to a task that runs a Job',
                path=f"{where}.{field}",
            )
    approvers = approval.approvers
    if approvers is not None and not approvers.users and not approvers.groups:
        yield ApprovalGateError(
            f'approval gate "{task.key}" lists no approvers: name users or groups, or leave '
            "approvers out (anyone with the approve verb on the run)",
            path=f"{where}.approval.approvers",
        )
    elif (
        approvers is not None and not approvers.groups and approval.required > len(approvers.users)
    ):
        yield ApprovalGateError(
            f'approval gate "{task.key}" requires {approval.required} approvals but lists only '
            f"{len(approvers.users)} users and no group",
            path=f"{where}.approval.required",
        )


def may_approve(approval: ApprovalSpec, actor: Actor) -> bool:
    """Whether the gate lets ``actor`` approve (or reject) it: any user when it lists no
    approvers, else a listed user or a member of a listed group."""
    approvers = approval.approvers
    if approvers is None:
        return True
    return actor.username in approvers.users or not set(approvers.groups).isdisjoint(actor.groups)


def approval_refusal(
    *,
    gate: str,
    approval: ApprovalSpec,
    actor: Actor,
    creator: str | None,
    approved_by: Collection[str],
) -> str | None:
    """Why ``actor``'s Approve of the gate does not count (None: it counts). ``creator``:
    who created the run; ``approved_by``: who approved it already."""
    if not may_approve(approval, actor):
        return f'{actor.username} is not an approver of "{gate}"'
    if approval.forbid_self and creator is not None and actor.username == creator:
        return f'{actor.username} created the run: "{gate}" forbids approving one\'s own run'
    if actor.username in approved_by:
        return f'{actor.username} has approved "{gate}" already: each person counts once'
    return None


def rejection_refusal(*, gate: str, approval: ApprovalSpec, actor: Actor) -> str | None:
    """Why ``actor`` may not reject the gate (None: they may): the gate's approvers may."""
    if not may_approve(approval, actor):
        return f'{actor.username} is not an approver of "{gate}"'
    return None
