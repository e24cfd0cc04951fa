"""Admission decisions for WorkflowDefinition and WorkflowRun, free of kopf and HTTP.

Each decision takes what an AdmissionReview carries (operation, object, old object, dry run,
namespace) plus a `DefinitionRegistry` and returns a `Verdict`. The kopf handlers in
`webhooks.py` only translate.

Admission decides and never writes: definitions are published by the operator from its watch
of persisted WorkflowDefinition objects. So every decision looks at both what the store has
published (the system of record: a definition deleted and re-created with other content under
the same version is still refused) and what the apiserver holds but the operator may not have
published yet (a run applied in the same `kubectl apply` as its definition must find it, and
two different contents for one version must not both be admitted).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from pydantic import ValidationError

from flowforge.domain.api import REQUESTED_BY_ANNOTATION, RETRY_OF_ANNOTATION
from flowforge.domain.caps import parameter_errors
from flowforge.domain.conditions import ConditionError
from flowforge.domain.errors import DefinitionError, InvalidDefinitionError
from flowforge.domain.expansion import expand
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.parameters import ParameterError
from flowforge.domain.queue import (
    concurrency_key,
    forbidden_message,
    key_parameter_errors,
    parallelism_error,
)
from flowforge.domain.run import RunSpec
from flowforge.domain.states import RunPhase
from flowforge.domain.validation import parse_definition

# A denial listing 10,000 errors helps nobody and bloats the apiserver's response.
MAX_LISTED_ERRORS = 50
# Status codes for denials, as the apiserver shows them to the user.
CODE_INVALID = 422
CODE_CONFLICT = 409
CODE_NOT_FOUND = 404
CODE_FORBIDDEN = 403


@dataclass(frozen=True)
class PersistedDefinition:
    """A WorkflowDefinition object the apiserver holds, published or not."""

    name: str
    version: int
    spec: Mapping[str, Any] | None  # None: not the version asked about (not kept)


class DefinitionRegistry(Protocol):
    """What admission reads (never writes): the store's published definitions and the
    WorkflowDefinition objects of the namespace."""

    async def published_fingerprint(
        self, *, namespace: str, workflow: str, version: int
    ) -> str | None:
        """The fingerprint published for that version, or None if it is not published."""
        ...

    async def published_versions(self, *, namespace: str, workflow: str) -> Sequence[int]:
        """Every published version of the workflow in the namespace (any order)."""
        ...

    async def persisted(
        self, *, namespace: str, workflow: str, version: int | None = None
    ) -> Sequence[PersistedDefinition]:
        """The workflow's WorkflowDefinition objects in the namespace, read from the apiserver
        (not a cache: an object created a moment ago must be there), with the spec of those
        of ``version`` only."""
        ...


@dataclass(frozen=True)
class RetrySource:
    """What the store holds about the run a new run retries (``spec.retryOf``)."""

    phase: str
    workflow: str
    parameters: Mapping[str, Any]


class RetrySources(Protocol):
    """What run admission reads (never writes) about the runs of the store."""

    async def run_named(self, *, namespace: str, name: str) -> RetrySource | None:
        """The newest run of that name in the namespace, or None."""
        ...

    async def running_runs(self, *, namespace: str, key: str) -> int:
        """Runs of that ``spec.concurrency`` key running or queued now."""
        ...


@dataclass(frozen=True)
class AdmissionRequest:
    operation: str
    namespace: str
    new_object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None
    dry_run: bool
    user: str = ""  # request.userInfo.username: who asks

    def new_definition(self) -> DefinitionSpec:
        """The new object's spec as a definition; InvalidDefinitionError when it is not one.

        Parsed once per review: every check of a WorkflowDefinition reads the same one.
        """
        parsed = self._new_definition
        if isinstance(parsed, InvalidDefinitionError):
            raise parsed
        return parsed

    @cached_property
    def _new_definition(self) -> DefinitionSpec | InvalidDefinitionError:
        # cached_property writes the instance's __dict__ directly, so a frozen one takes it
        try:
            return parse_definition(_spec_of(self.new_object))
        except InvalidDefinitionError as error:
            return error


@dataclass(frozen=True)
class JsonPatchOperation:
    op: str
    path: str
    value: Any


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""
    code: int = 200
    patch: tuple[JsonPatchOperation, ...] = field(default=())

    @classmethod
    def allow(cls, *patch: JsonPatchOperation) -> Verdict:
        return cls(allowed=True, patch=patch)

    @classmethod
    def deny(cls, message: str, *, code: int) -> Verdict:
        return cls(allowed=False, message=message, code=code)


def _spec_of(obj: Mapping[str, Any] | None) -> Any:
    if not isinstance(obj, Mapping):
        return None
    return obj.get("spec")


def describe_errors(errors: Sequence[DefinitionError]) -> str:
    """Every error as `<path>: <message>`, one per line (capped at MAX_LISTED_ERRORS)."""
    errors = list(dict.fromkeys(errors))  # the same error reported twice helps nobody
    lines = [f"{error.path}: {error.message}" for error in errors[:MAX_LISTED_ERRORS]]
    if len(errors) > MAX_LISTED_ERRORS:
        lines.append(f"... and {len(errors) - MAX_LISTED_ERRORS} more errors")
    noun = "error" if len(errors) == 1 else "errors"
    return f"invalid WorkflowDefinition ({len(errors)} {noun}):\n" + "\n".join(lines)


# --- WorkflowDefinition -------------------------------------------------------------------------


async def decide_definition(request: AdmissionRequest, registry: DefinitionRegistry) -> Verdict:
    if request.operation == "CREATE":
        return await _decide_definition_create(request, registry)
    if request.operation == "UPDATE":
        return _decide_definition_update(request)
    return Verdict.allow()


async def _decide_definition_create(
    request: AdmissionRequest, registry: DefinitionRegistry
) -> Verdict:
    try:
        definition = request.new_definition()
    except InvalidDefinitionError as error:
        return Verdict.deny(describe_errors(error.errors), code=CODE_INVALID)
    namespace, workflow = request.namespace, definition.workflow
    # three independent reads (store, apiserver, store): asked at once, judged in this order
    published, persisted, versions = await asyncio.gather(
        registry.published_fingerprint(
            namespace=namespace, workflow=workflow, version=definition.version
        ),
        registry.persisted(namespace=namespace, workflow=workflow, version=definition.version),
        registry.published_versions(namespace=namespace, workflow=workflow),
    )
    if published is not None:
        if published == definition.fingerprint:
            return Verdict.allow()  # re-created with the published content: a no-op
        return _conflict(definition, held_by="is already published")
    for other in persisted:
        if other.spec is None:
            continue
        if _fingerprint_or_none(other.spec) != definition.fingerprint:
            return _conflict(
                definition, held_by="is already held by another WorkflowDefinition object"
            )
        return Verdict.allow()
    newest = max([*versions, *(other.version for other in persisted)], default=0)
    if definition.version == newest + 1:
        return Verdict.allow()
    return Verdict.deny(_version_gap(definition, newest=newest), code=CODE_INVALID)


def _version_gap(definition: DefinitionSpec, *, newest: int) -> str:
    """What is wrong with the version asked for, never which versions are stored (a refusal
    goes to whoever asked, who may not be allowed to list them)."""
    version = definition.version
    if newest == 0:
        situation = f"workflow {definition.workflow!r} has no version yet: publish version 1"
    elif version > newest:
        situation = f"version {version} skips versions"
    else:
        situation = f"version {version} was never published and is not the next one"
    return (
        f"spec.version: {situation}; a new version must be the next integer after the "
        "newest (`kubectl get workflowdefinitions` lists them)"
    )


def _fingerprint_or_none(spec: Any) -> str | None:
    parsed = _parsed_or_none(spec)
    return None if parsed is None else parsed.fingerprint


def _conflict(definition: DefinitionSpec, *, held_by: str) -> Verdict:
    """Names the version taken, not what holds it (the stored content's fingerprint)."""
    version = definition.version
    return Verdict.deny(
        f"spec.version: workflow {definition.workflow!r} version {version} {held_by} with "
        f"different content (this one's fingerprint {definition.fingerprint[:19]}); a "
        "published version is immutable: publish a new version (the next after the newest)",
        code=CODE_CONFLICT,
    )


def _parsed_or_none(spec: Any) -> DefinitionSpec | None:
    try:
        return parse_definition(spec)
    except InvalidDefinitionError:
        return None


def _decide_definition_update(request: AdmissionRequest) -> Verdict:
    old_spec = _spec_of(request.old_object)
    new_spec = _spec_of(request.new_object)
    if old_spec == new_spec:
        return Verdict.allow()
    try:
        new_definition = request.new_definition()
    except InvalidDefinitionError as error:
        return Verdict.deny(describe_errors(error.errors), code=CODE_INVALID)
    old_definition = _parsed_or_none(old_spec)
    if old_definition is not None and old_definition.fingerprint == new_definition.fingerprint:
        # Same meaning (e.g. tasks reordered): nothing a run would do changes.
        return Verdict.allow()
    old_fingerprint = "(invalid)" if old_definition is None else old_definition.fingerprint
    version = new_definition.version
    return Verdict.deny(
        f"the spec of WorkflowDefinition {new_definition.workflow!r} version {version} cannot "
        f"change once published (published fingerprint {old_fingerprint[:12]}, this one "
        f"{new_definition.fingerprint[:12]}); only metadata such as labels and annotations may "
        f"be edited: publish a new version (a new WorkflowDefinition with spec.version: "
        f"{version + 1})",
        code=CODE_FORBIDDEN,
    )


# --- WorkflowRun --------------------------------------------------------------------------------


def _field_path(location: tuple[int | str, ...]) -> str:
    path = "spec"
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _run_shape_errors(spec: Any) -> list[str]:
    """The run spec checked strictly against the same model the CRD schema comes from."""
    if not isinstance(spec, Mapping):
        return ["spec: must be an object with at least spec.workflow"]
    try:
        parsed = RunSpec.model_validate(spec, strict=True)
    except ValidationError as error:
        return [
            f"{_field_path(detail['loc'])}: {detail['msg']}"
            for detail in error.errors(include_url=False)
        ]
    return [f"{path}: {message}" for path, message in parameter_errors(parsed.parameters)]


async def runnable_versions(
    registry: DefinitionRegistry, *, namespace: str, workflow: str
) -> list[int]:
    """Published versions and those whose object is persisted but maybe not yet published:
    the operator publishes such a definition before it starts the run."""
    published, persisted = await asyncio.gather(
        registry.published_versions(namespace=namespace, workflow=workflow),
        registry.persisted(namespace=namespace, workflow=workflow),
    )
    return sorted({*published, *(other.version for other in persisted)})


_REQUESTED_BY_PATH = "/metadata/annotations/" + REQUESTED_BY_ANNOTATION.replace("/", "~1")
_REQUESTED_BY_FIELD = f"metadata.annotations[{REQUESTED_BY_ANNOTATION}]"


def _annotations_of(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


async def decide_run_mutation(request: AdmissionRequest, registry: DefinitionRegistry) -> Verdict:
    """On CREATE, record who asks (``flowforge.io/requested-by``, whatever the object said)
    and pin the newest version (published or persisted) when the run names none.

    Anything malformed is left untouched for the validating webhook to deny with a full message.
    """
    if request.operation != "CREATE":
        return Verdict.allow()
    patch: list[JsonPatchOperation] = []
    if request.user:
        patch.append(JsonPatchOperation(op="add", path=_REQUESTED_BY_PATH, value=request.user))
    spec = _spec_of(request.new_object)
    if not isinstance(spec, Mapping) or spec.get("version") is not None:
        return Verdict.allow(*patch)
    workflow = spec.get("workflow")
    if not isinstance(workflow, str) or not workflow:
        return Verdict.allow(*patch)
    versions = await runnable_versions(registry, namespace=request.namespace, workflow=workflow)
    if versions:
        patch.append(JsonPatchOperation(op="add", path="/spec/version", value=max(versions)))
    return Verdict.allow(*patch)


async def decide_run(
    request: AdmissionRequest,
    registry: DefinitionRegistry,
    *,
    runs: RetrySources | None = None,
) -> Verdict:
    """``runs`` is where ``spec.retryOf`` is looked up; without it a retry is refused."""
    if request.operation == "CREATE":
        return await _decide_run_create(request, registry, runs)
    if request.operation == "UPDATE":
        return _decide_run_update(request)
    return Verdict.allow()


def _requester_error(request: AdmissionRequest) -> str | None:
    """Only the mutating webhook writes who asked: a value set by anyone else is refused."""
    claimed = _annotations_of(request.new_object).get(REQUESTED_BY_ANNOTATION)
    if claimed is None or not request.user or claimed == request.user:
        return None
    return (
        f"{_REQUESTED_BY_FIELD}: is set by FlowForge to the requesting user ({request.user!r}) "
        f"and cannot be set to {claimed!r}"
    )


async def _decide_run_create(
    request: AdmissionRequest, registry: DefinitionRegistry, runs: RetrySources | None
) -> Verdict:
    spec = _spec_of(request.new_object)
    errors = _run_shape_errors(spec)
    if RETRY_OF_ANNOTATION in _annotations_of(request.new_object):
        errors.append(
            f"metadata.annotations[{RETRY_OF_ANNOTATION}]: no longer supported; "
            "name the run to retry in spec.retryOf"
        )
    requester = _requester_error(request)
    if requester is not None:
        errors.append(requester)
    if errors:
        return Verdict.deny("invalid WorkflowRun:\n" + "\n".join(errors), code=CODE_INVALID)
    assert isinstance(spec, Mapping)
    workflow: str = spec["workflow"]
    version: int | None = spec.get("version")
    versions = await runnable_versions(registry, namespace=request.namespace, workflow=workflow)
    if not versions:
        return Verdict.deny(
            f"spec.workflow: workflow {workflow!r} has no published version in namespace "
            f"{request.namespace!r}; apply its WorkflowDefinition first",
            code=CODE_NOT_FOUND,
        )
    if version is None:
        return Verdict.deny(
            "spec.version: missing (the mutating webhook pins the newest published version; "
            "is it configured?)",
            code=CODE_INVALID,
        )
    if version not in versions:
        return Verdict.deny(
            f"spec.version: workflow {workflow!r} version {version} is not published in "
            f"namespace {request.namespace!r} (`kubectl get workflowdefinitions` lists them)",
            code=CODE_NOT_FOUND,
        )
    retry_of: str | None = spec.get("retryOf")
    if retry_of is not None:
        return await _decide_retry(request, spec=spec, retry_of=retry_of, runs=runs)
    return Verdict.allow()


RETRYABLE_PHASES = frozenset({RunPhase.FAILED, RunPhase.CANCELLED})


def canonical_json(value: Any) -> str:
    """One text per JSON value: key order and spacing never matter."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


async def _decide_retry(
    request: AdmissionRequest,
    *,
    spec: Mapping[str, Any],
    retry_of: str,
    runs: RetrySources | None,
) -> Verdict:
    """A retry names a finished, unsuccessful run of the same workflow in the review's
    namespace, with identical parameters."""
    namespace = request.namespace
    name = (request.new_object or {}).get("metadata", {}).get("name")
    if retry_of == name:
        return Verdict.deny("spec.retryOf: a run cannot retry itself", code=CODE_INVALID)
    if runs is None:
        return Verdict.deny(
            "spec.retryOf: retries cannot be checked by this webhook", code=CODE_FORBIDDEN
        )
    source = await runs.run_named(namespace=namespace, name=retry_of)
    if source is None:
        return Verdict.deny(
            f"spec.retryOf: no run named {retry_of!r} in namespace {namespace!r} (a retry "
            "names a run of its own namespace)",
            code=CODE_NOT_FOUND,
        )
    # the refusals below say what is wrong with this run, never the named run's stored
    # phase, workflow or values (the review may name a run its requester cannot read)
    if source.phase not in RETRYABLE_PHASES:
        return Verdict.deny(
            f"spec.retryOf: run {retry_of!r} is not Failed or Cancelled; only a finished, "
            "unsuccessful run can be retried (wait for it to finish, or cancel it)",
            code=CODE_CONFLICT,
        )
    if source.workflow != spec["workflow"]:
        return Verdict.deny(
            f"spec.retryOf: run {retry_of!r} runs another workflow than spec.workflow "
            f"({spec['workflow']!r})",
            code=CODE_INVALID,
        )
    asked = dict(spec.get("parameters") or {})
    if canonical_json(dict(source.parameters)) != canonical_json(asked):
        # names this run gave only: the stored values, and names, are the old run's
        differ = sorted(
            name
            for name in asked
            if canonical_json(source.parameters.get(name)) != canonical_json(asked[name])
        )
        which = f" (these differ: {', '.join(differ)})" if differ else ""
        return Verdict.deny(
            f"spec.retryOf: run {retry_of!r} ran with other parameters{which}; a retry runs "
            "with identical spec.parameters (`flowforge retry` copies them)",
            code=CODE_INVALID,
        )
    return Verdict.allow()


def _decide_run_update(request: AdmissionRequest) -> Verdict:
    old_requester = _annotations_of(request.old_object).get(REQUESTED_BY_ANNOTATION)
    if _annotations_of(request.new_object).get(REQUESTED_BY_ANNOTATION) != old_requester:
        return Verdict.deny(
            f"{_REQUESTED_BY_FIELD}: records who created the run and cannot change",
            code=CODE_FORBIDDEN,
        )
    old_spec = _spec_of(request.old_object)
    new_spec = _spec_of(request.new_object)
    if old_spec == new_spec:
        return Verdict.allow()
    if not isinstance(old_spec, Mapping) or not isinstance(new_spec, Mapping):
        return Verdict.deny(
            "spec: only spec.cancel may change on a WorkflowRun", code=CODE_FORBIDDEN
        )
    changed = sorted(
        str(key)
        for key in set(old_spec) | set(new_spec)
        if key != "cancel" and old_spec.get(key) != new_spec.get(key)
    )
    if changed:
        fields = ", ".join(f"spec.{key}" for key in changed)
        return Verdict.deny(
            f"{fields}: cannot change on a WorkflowRun; only spec.cancel may change "
            "(start a new run instead)",
            code=CODE_FORBIDDEN,
        )
    cancel = new_spec.get("cancel")
    if cancel is not None and not isinstance(cancel, bool):
        return Verdict.deny("spec.cancel: must be a boolean", code=CODE_INVALID)
    if old_spec.get("cancel") is True and cancel is not True:
        return Verdict.deny(
            "spec.cancel: a cancelled run cannot be resumed; start a new run instead",
            code=CODE_FORBIDDEN,
        )
    return Verdict.allow()


async def decide_run_limits(
    request: AdmissionRequest, *, definition: DefinitionSpec | None, runs: RetrySources | None
) -> Verdict:
    """On CREATE, against the definition the run would run: the run expands (its
    parameters fit the declarations, its conditions evaluate: `domain/expansion.py`),
    ``spec.maxParallelTasks`` only lowers the definition's, every parameter of the
    concurrency key is given, and a ``Forbid`` workflow whose key is full refuses the run,
    saying why (``flowforge.domain.queue``)."""
    spec = _spec_of(request.new_object)
    if request.operation != "CREATE" or definition is None or not isinstance(spec, Mapping):
        return Verdict.allow()
    raw = spec.get("parameters") if isinstance(spec.get("parameters"), Mapping) else {}
    assert isinstance(raw, Mapping)
    try:
        # the run's shape, as the operator will create it: typed parameters, conditions
        parameters = expand(definition, raw).parameters
    except ParameterError as error:
        return Verdict.deny(
            "invalid WorkflowRun:\n"
            + "\n".join(f"{path}: {message}" for path, message in error.errors),
            code=CODE_INVALID,
        )
    except ConditionError as error:
        return Verdict.deny(f"invalid WorkflowRun:\n{error}", code=CODE_INVALID)
    errors = key_parameter_errors(definition, parameters)
    requested = spec.get("maxParallelTasks")
    too_many = parallelism_error(definition, requested if type(requested) is int else None)
    if too_many is not None:
        errors.append(too_many)
    if errors:
        return Verdict.deny("invalid WorkflowRun:\n" + "\n".join(errors), code=CODE_INVALID)
    key = concurrency_key(definition, parameters)
    if key is None or runs is None:
        return Verdict.allow()
    running = await runs.running_runs(namespace=request.namespace, key=key)
    refused = forbidden_message(definition, parameters, running=running)
    return Verdict.allow() if refused is None else Verdict.deny(refused, code=CODE_CONFLICT)
