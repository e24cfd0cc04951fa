"""Admission of a WorkflowSchedule: its own shape, then everything a run it makes would meet.

A schedule gives nobody more than creating the run would: after its spec parses (a 5-field
cron expression or ``@every`` of at least 10 s, an IANA zone the ``tzdata`` package knows,
errors naming the field), the workflow must have a runnable version (the one pinned, or any),
its parameters must fit the definition (``schedule_parameter_errors``: its typed parameter
declarations, as a run's are), and the author must pass the checks
of a run's author (``admission_access.decide_run_access``: Jobs, ServiceAccounts, the
namespace's policies), asked about the run the schedule would make. It reads and never writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from flowforge.admission.access import AccessChecks, decide_run_access
from flowforge.admission.review import (
    CODE_INVALID,
    CODE_NOT_FOUND,
    AdmissionRequest,
    DefinitionRegistry,
    JsonPatchOperation,
    Verdict,
    runnable_versions,
)
from flowforge.domain.api import API_VERSION, REQUESTED_BY_ANNOTATION, RUN_KIND
from flowforge.domain.caps import parameter_errors
from flowforge.domain.conditions import ConditionError
from flowforge.domain.expansion import expand
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.parameters import ParameterError
from flowforge.domain.queue import key_parameter_errors
from flowforge.domain.schedule import (
    ScheduleSpecError,
    check_schedule_name,
    parse_schedule_spec,
)
from flowforge.kube.access_review import UserInfo

_INVALID = "invalid WorkflowSchedule:\n"
_AUTHOR_PATH = "/metadata/annotations/" + REQUESTED_BY_ANNOTATION.replace("/", "~1")
_AUTHOR_FIELD = f"metadata.annotations[{REQUESTED_BY_ANNOTATION}]"


def decide_schedule_mutation(request: AdmissionRequest) -> Verdict:
    """Record who wrote the schedule (``flowforge.io/requested-by``, whatever the object
    said): its runs record this author, so a schedule's author is never what it claims."""
    if request.operation not in ("CREATE", "UPDATE") or not request.user:
        return Verdict.allow()
    return Verdict.allow(JsonPatchOperation(op="add", path=_AUTHOR_PATH, value=request.user))


def schedule_parameter_errors(
    definition: DefinitionSpec, parameters: Mapping[str, Any]
) -> list[str]:
    """Every reason ``parameters`` do not fit ``definition``, field named: the caps, the
    definition's typed declarations and its ``when`` conditions (the same expansion a run of
    the schedule gets, `domain/expansion.py`), and the concurrency key's parameters."""
    errors = [f"{path}: {message}" for path, message in parameter_errors(parameters)]
    try:
        effective = expand(definition, parameters).parameters
    except ParameterError as error:
        return errors + [f"{path}: {message}" for path, message in error.errors]
    except ConditionError as error:
        return [*errors, str(error)]
    return errors + key_parameter_errors(definition, effective)


def _metadata(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    metadata = (obj or {}).get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


async def decide_schedule(
    request: AdmissionRequest,
    *,
    definitions: DefinitionRegistry,
    user: UserInfo | None,
    checks: AccessChecks,
) -> Verdict:
    if request.operation not in ("CREATE", "UPDATE"):
        return Verdict.allow()
    metadata = _metadata(request.new_object)
    name = metadata.get("name")
    annotations = metadata.get("annotations")
    claimed = annotations.get(REQUESTED_BY_ANNOTATION) if isinstance(annotations, Mapping) else None
    if claimed is not None and request.user and claimed != request.user:
        return Verdict.deny(
            f"{_INVALID}{_AUTHOR_FIELD}: is set by FlowForge to the requesting user "
            f"({request.user!r}) and cannot be set to {claimed!r}",
            code=CODE_INVALID,
        )
    try:
        spec = parse_schedule_spec((request.new_object or {}).get("spec"))
        if isinstance(name, str):
            check_schedule_name(name)
    except ScheduleSpecError as error:
        return Verdict.deny(_INVALID + str(error), code=CODE_INVALID)
    versions = await runnable_versions(
        definitions, namespace=request.namespace, workflow=spec.workflow
    )
    if not versions:
        return Verdict.deny(
            f"spec.workflow: workflow {spec.workflow!r} has no published version in namespace "
            f"{request.namespace!r}; apply its WorkflowDefinition first",
            code=CODE_NOT_FOUND,
        )
    version = max(versions) if spec.version is None else spec.version
    if version not in versions:
        return Verdict.deny(
            f"spec.version: workflow {spec.workflow!r} version {version} is not published in "
            f"namespace {request.namespace!r}",
            code=CODE_NOT_FOUND,
        )
    definition = await checks.load_definition(
        namespace=request.namespace, workflow=spec.workflow, version=version
    )
    if definition is not None:
        errors = schedule_parameter_errors(definition, spec.parameters)
        if errors:
            return Verdict.deny(_INVALID + "\n".join(errors), code=CODE_INVALID)
    # the author is asked about the run this schedule would make, as its creator would be
    run = {
        "apiVersion": API_VERSION,
        "kind": RUN_KIND,
        "metadata": {"namespace": request.namespace, "name": f"{name}-admission"},
        "spec": {"workflow": spec.workflow, "version": version, "parameters": spec.parameters},
    }
    as_run = dataclasses.replace(request, operation="CREATE", new_object=run, old_object=None)
    verdict = await decide_run_access(as_run, user=user, checks=checks)
    if not verdict.allowed:
        return Verdict.deny(f"WorkflowSchedule: {verdict.message}", code=verdict.code)
    return Verdict.allow()
