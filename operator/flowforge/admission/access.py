"""Admission checks of who asks and what the namespace's policy allows.

Whoever publishes a WorkflowDefinition or creates a WorkflowRun gets Jobs created for them by
the operator, so they must themselves be allowed what those Jobs need: ``create`` on
``jobs.batch`` in the namespace and ``use`` on every ServiceAccount the definition names
(a custom verb: the chart's ClusterRole ``flowforge-serviceaccount-user`` grants it, bound
per ServiceAccount). And the definition must pass every FlowForgePolicy of the namespace
(`flowforge.domain.policy`). Both are checked again for each run, so a policy tightened or a
permission revoked after publishing stops new runs.

These run after the decisions in `admission.py` allowed the request; a denial names every
missing permission and every field the policy refuses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from flowforge.admission.review import (
    CODE_FORBIDDEN,
    MAX_LISTED_ERRORS,
    AdmissionRequest,
    Verdict,
)
from flowforge.domain.errors import InvalidDefinitionError, UserError
from flowforge.domain.expansion import Expansion, expand
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.policy import (
    Holdings,
    Policy,
    definition_violations,
    expansion_violations,
    holding_violations,
    named_service_accounts,
    parameter_violations,
    policies_or_default,
    priority_violations,
    read_policies,
)
from flowforge.domain.run import MAX_PRIORITY
from flowforge.kube.access_review import (
    CREATE_JOBS,
    AccessReviewUnavailable,
    Permission,
    UserInfo,
    use_service_account,
)
from flowforge.store.run_rows import task_rows

CODE_UNAVAILABLE = 503

ListPolicies = Callable[[str], Awaitable[list[dict[str, Any]]]]
LoadDefinition = Callable[..., Awaitable[DefinitionSpec | None]]
ReadHoldings = Callable[[str], Awaitable[Holdings]]


class AccessReviewer(Protocol):
    async def missing(
        self, user: UserInfo, *, namespace: str, permissions: Sequence[Permission]
    ) -> list[Permission]: ...


@dataclass(frozen=True)
class AccessChecks:
    """What the checks read: SubjectAccessReviews, the namespace's FlowForgePolicy objects,
    and (for a run) its definition, published or persisted:
    ``load_definition(namespace=, workflow=, version=)``, and what the namespace's runs
    hold in the store (``holdings(namespace)``, read only when a policy caps it)."""

    reviewer: AccessReviewer
    list_policies: ListPolicies
    load_definition: LoadDefinition
    holdings: ReadHoldings


def missing_line(user: UserInfo, permission: Permission, *, namespace: str, why: str) -> str:
    """One refusal line: who may not do what where, the permission, and ``why`` it is
    needed."""
    if permission.resource == "serviceaccounts":
        action = f"use serviceaccount {permission.name!r}"
    else:
        action = f"{permission.verb} {permission.resource}"
        if permission.name:
            action += f" {permission.name!r}"
    return (
        f"user {user.username} may not {action} in namespace {namespace} "
        f"({permission.describe()}){why}"
    )


async def _decide_access(
    checks: AccessChecks,
    *,
    user: UserInfo | None,
    namespace: str,
    definition: DefinitionSpec,
    parameters: Mapping[str, str],
    priority: int | None,
    action: str,
    expansion: Expansion | None = None,
) -> Verdict:
    if user is None:
        return Verdict.deny(
            f"the request names no user, so nobody may {action}", code=CODE_FORBIDDEN
        )
    accounts = named_service_accounts(definition)
    needed: dict[Permission, str] = {CREATE_JOBS: ": the operator creates its Jobs for you"}
    for path, account in accounts:
        needed.setdefault(use_service_account(account), f" (named by {path})")
    # two independent round trips, asked at once; their failures are judged in this order
    objects, missing = await asyncio.gather(
        checks.list_policies(namespace),
        checks.reviewer.missing(user, namespace=namespace, permissions=list(needed)),
        return_exceptions=True,
    )
    if isinstance(objects, BaseException):
        if not isinstance(objects, Exception):
            raise objects
        return Verdict.deny(
            f"cannot {action} now: the FlowForgePolicy objects of namespace {namespace} cannot "
            f"be read ({type(objects).__name__}: {objects}); try again",
            code=CODE_UNAVAILABLE,
        )
    if isinstance(missing, BaseException):
        if not isinstance(missing, AccessReviewUnavailable):
            raise missing
        return Verdict.deny(f"cannot {action} now: {missing}; try again", code=CODE_UNAVAILABLE)
    policies, problems = read_policies(objects, namespace=namespace)
    lines = [missing_line(user, p, namespace=namespace, why=needed[p]) for p in missing]
    lines += problems
    in_force = policies_or_default(policies, namespace=namespace)
    violations = definition_violations(definition, in_force)
    violations += parameter_violations(parameters, in_force)
    if priority is not None:
        violations += priority_violations(priority, in_force)
    if expansion is not None:
        violations += expansion_violations(definition, expansion, in_force)
        if any(_caps_holdings(policy) for policy in in_force):
            try:  # one read of the store, only when a policy caps what it holds
                held = await checks.holdings(namespace)
            except Exception as error:  # the store did not answer: no guess either way
                return Verdict.deny(
                    f"cannot {action} now: what namespace {namespace} holds cannot be read "
                    f"({type(error).__name__}); try again",
                    code=CODE_UNAVAILABLE,
                )
            rows = len(task_rows(definition, expansion, frozenset()))
            violations += holding_violations(held, rows=rows, policies=in_force)
    lines += [str(violation) for violation in violations]
    if not lines:
        return Verdict.allow()
    listed = lines[:MAX_LISTED_ERRORS]
    if len(lines) > MAX_LISTED_ERRORS:
        listed.append(f"... and {len(lines) - MAX_LISTED_ERRORS} more")
    return Verdict.deny(
        f"refused: {user.username} may not {action} in namespace {namespace}:\n"
        + "\n".join(listed),
        code=CODE_FORBIDDEN,
    )


def _caps_holdings(policy: Policy) -> bool:
    """Whether the policy caps what the namespace's runs hold (``maxQueuedRuns``,
    ``maxTaskRows``)."""
    return policy.spec.max_queued_runs is not None or policy.spec.max_task_rows is not None


def _priority(spec: Mapping[str, Any]) -> int:
    """The run's ``spec.priority`` (0 when omitted, as the schema defaults it; a value of
    another type, which the schema refuses, is judged as the highest there is)."""
    value = spec.get("priority", 0)
    return value if type(value) is int else MAX_PRIORITY


def _spec(obj: Mapping[str, Any] | None) -> Any:
    return obj.get("spec") if isinstance(obj, Mapping) else None


async def decide_definition_access(
    request: AdmissionRequest, *, user: UserInfo | None, checks: AccessChecks
) -> Verdict:
    """On CREATE: the publisher may create Jobs and use each ServiceAccount named, and the
    definition passes the namespace's policies. (A spec never changes on UPDATE.)"""
    if request.operation != "CREATE":
        return Verdict.allow()
    try:
        definition = request.new_definition()
    except InvalidDefinitionError:
        return Verdict.allow()  # admission.decide_definition has denied it, naming why
    return await _decide_access(
        checks,
        user=user,
        namespace=request.namespace,
        definition=definition,
        parameters={},
        priority=None,
        action="publish this WorkflowDefinition",
    )


async def decide_run_access(
    request: AdmissionRequest, *, user: UserInfo | None, checks: AccessChecks
) -> Verdict:
    """On CREATE: whoever starts the run may create Jobs and use each ServiceAccount of its
    definition, and definition, parameters and priority pass the namespace's policies as
    they are now."""
    if request.operation != "CREATE":
        return Verdict.allow()
    spec = _spec(request.new_object)
    if not isinstance(spec, Mapping):
        return Verdict.allow()  # admission.decide_run has denied it
    workflow, version = spec.get("workflow"), spec.get("version")
    if not isinstance(workflow, str) or type(version) is not int:
        return Verdict.allow()  # likewise
    definition = await checks.load_definition(
        namespace=request.namespace, workflow=workflow, version=version
    )
    if definition is None:
        return Verdict.deny(
            f"spec.version: workflow {workflow!r} version {version} cannot be read to check "
            "who may run it",
            code=CODE_FORBIDDEN,
        )
    raw_parameters = spec.get("parameters")
    parameters = (
        {str(k): str(v) for k, v in raw_parameters.items()}
        if isinstance(raw_parameters, Mapping)
        else {}
    )
    try:  # the run's shape, as the operator will create it (its own refusals are decide_run's)
        expansion = expand(
            definition, raw_parameters if isinstance(raw_parameters, Mapping) else {}
        )
    except UserError:
        expansion = None
    return await _decide_access(
        checks,
        user=user,
        namespace=request.namespace,
        definition=definition,
        parameters=parameters,
        priority=_priority(spec),
        action=f"run workflow {workflow!r} version {version}",
        expansion=expansion,
    )
