"""kopf admission handlers: thin translations between kopf and `admission.py`.

One handler per resource and purpose, each with a stable id that is also its URL path
(`/validate-workflowdefinition`, ...), so every check of a resource runs in one handler and
all its errors reach the user together.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf

from flowforge.admission.access import (
    AccessChecks,
    decide_definition_access,
    decide_run_access,
)
from flowforge.admission.actions import decide_action, decide_action_mutation
from flowforge.admission.dryrun import DryRunBudget, decide_definition_dry_run
from flowforge.admission.requester import judge_requester
from flowforge.admission.review import (
    AdmissionRequest,
    DefinitionRegistry,
    JsonPatchOperation,
    RetrySources,
    Verdict,
    decide_definition,
    decide_run,
    decide_run_limits,
    decide_run_mutation,
)
from flowforge.admission.schedule import decide_schedule, decide_schedule_mutation
from flowforge.domain.api import GROUP, VERSION
from flowforge.domain.errors import InvalidDefinitionError
from flowforge.domain.models import DefinitionSpec
from flowforge.kube.access_review import UserInfo
from flowforge.kube.dryrun import DryRunCreator
from flowforge.kube.webhook_config import (
    MUTATE_ACTION_HANDLER_ID,
    MUTATE_RUN_HANDLER_ID,
    MUTATE_SCHEDULE_HANDLER_ID,
    MUTATING_HANDLERS,
    VALIDATE_ACTION_HANDLER_ID,
    VALIDATE_DEFINITION_HANDLER_ID,
    VALIDATE_RUN_HANDLER_ID,
    VALIDATE_SCHEDULE_HANDLER_ID,
    VALIDATING_HANDLERS,
)

RegistryProvider = Callable[[], DefinitionRegistry]
RetrySourcesProvider = Callable[[], RetrySources]
AccessProvider = Callable[[], AccessChecks]
DryRunProvider = Callable[[], DryRunCreator]
Handler = Callable[..., Awaitable[None]]


def _raw(body: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    return None if body is None else dict(body)


def _namespace_of(body: Mapping[str, Any] | None) -> str:
    # The review's request.namespace: the server (review_guard) has denied any object naming
    # another one and written the review's into any object naming none.
    metadata = body.get("metadata") if body is not None else None
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    return namespace if isinstance(namespace, str) else ""


def _username(handler_kwargs: Mapping[str, Any]) -> str:
    userinfo = handler_kwargs.get("userinfo")
    username = userinfo.get("username") if isinstance(userinfo, Mapping) else None
    return username if isinstance(username, str) else ""


def _request(handler_kwargs: Mapping[str, Any]) -> AdmissionRequest:
    """The AdmissionReview-level facts out of kopf's handler keyword arguments."""
    old: Mapping[str, Any] | None = handler_kwargs.get("old")
    new: Mapping[str, Any] | None = handler_kwargs.get("new")
    return AdmissionRequest(
        operation=str(handler_kwargs.get("operation")),
        namespace=_namespace_of(new if new is not None else old),
        new_object=_raw(new),
        old_object=_raw(old),
        dry_run=bool(handler_kwargs.get("dryrun")),
        user=_username(handler_kwargs),
    )


def _enforce(verdict: Verdict) -> None:
    if not verdict.allowed:
        raise kopf.AdmissionError(verdict.message, code=verdict.code)


def _apply_to_patch(patch: kopf.Patch, operations: tuple[JsonPatchOperation, ...]) -> None:
    """Express our add/replace operations as kopf's merge-style patch (kopf emits JSON patch)."""
    for operation in operations:
        if operation.op not in ("add", "replace"):
            raise ValueError(f"unsupported patch operation {operation.op!r}")
        *parents, leaf = (
            part.replace("~1", "/").replace("~0", "~")
            for part in operation.path.strip("/").split("/")
        )
        target: dict[str, Any] = patch
        for key in parents:
            target = target.setdefault(key, {})
        target[leaf] = operation.value


def _user(handler_kwargs: Mapping[str, Any]) -> UserInfo | None:
    """Who asked: the review's request.userInfo, as the apiserver authenticated them."""
    return UserInfo.from_review(handler_kwargs.get("userinfo"))


async def _run_definition(request: AdmissionRequest, checks: AccessChecks) -> DefinitionSpec | None:
    """The definition a run being created would run (decide_run has checked its spec)."""
    spec = (request.new_object or {}).get("spec")
    if request.operation != "CREATE" or not isinstance(spec, Mapping):
        return None
    workflow, version = spec.get("workflow"), spec.get("version")
    if not isinstance(workflow, str) or type(version) is not int:
        return None
    return await checks.load_definition(
        namespace=request.namespace, workflow=workflow, version=version
    )


async def decide_definition_checks(
    request: AdmissionRequest,
    *,
    registry: DefinitionRegistry,
    user: UserInfo | None,
    checks: AccessChecks,
    creator: DryRunCreator | None,
    warnings: list[str] | None,
    budget: DryRunBudget | None = None,
) -> Verdict:
    """Every check of a WorkflowDefinition, judged in one order: its shape and versions, then
    who asks and the policy, then the apiserver's dry-run; the first refusal is the answer.

    The spec is parsed once (`AdmissionRequest.new_definition`); a spec that does not parse
    is refused before anything is asked. The checks' round trips (store, apiserver lists,
    SubjectAccessReviews, dry-runs: all read-only) run at once, so a refused definition may
    have been dry-run too; its warnings are shown only when the dry-run's verdict is the one
    given, as when the checks ran one after another.
    """
    if request.operation == "CREATE":
        try:
            request.new_definition()
        except InvalidDefinitionError:
            return await decide_definition(request, registry)  # the denial names every error
    dry_run_warnings: list[str] = []
    shape, access, templates = await asyncio.gather(
        decide_definition(request, registry),
        decide_definition_access(request, user=user, checks=checks),
        _allowed()
        if creator is None
        else decide_definition_dry_run(
            request, creator=creator, warnings=dry_run_warnings, budget=budget
        ),
        return_exceptions=True,
    )
    for verdict in (shape, access, templates):
        if isinstance(verdict, BaseException):
            raise verdict
        if verdict is templates and warnings is not None:
            warnings.extend(dry_run_warnings)
        if not verdict.allowed:
            return verdict
    return Verdict.allow()


async def _allowed() -> Verdict:
    return Verdict.allow()


def register_admission_handlers(
    registry: kopf.OperatorRegistry,
    *,
    definitions: RegistryProvider,
    access: AccessProvider,
    runs: RetrySourcesProvider | None = None,
    dry_run: DryRunProvider | None = None,
    dry_run_budget: DryRunBudget | None = None,
) -> None:
    """Register the admission handlers on `registry`, one per webhook entry of
    `kube/webhook_config.py` (its id, resource and operations). Each first judges who asks
    (`requester.judge_requester`, with ``access``'s reviewer): a requester who may not make
    the request gets a refusal, and nothing is read for them.

    `definitions`, `access` (who asks, the namespace's policies), `runs` (where
    `spec.retryOf` is looked up) and `dry_run` (the apiserver's dry-run of each task type's
    Job and Pod; none: not asked) are called per request, so the operator can open its store
    in a startup handler after registration. ``dry_run_budget`` bounds the dry-runs each
    requester causes (none: unbounded).
    """
    validating = {spec.handler_id: spec for spec in VALIDATING_HANDLERS}
    mutating = {spec.handler_id: spec for spec in MUTATING_HANDLERS}

    def webhook(handler_id: str) -> Callable[[Handler], Handler]:
        """kopf's handler for the webhook entry ``handler_id``: validating or mutating, for
        the resource and operations the webhook configuration names; its requester judged
        before it runs (`requester.py`)."""
        on = kopf.on.validate if handler_id in validating else kopf.on.mutate
        spec = validating.get(handler_id) or mutating[handler_id]
        register = on(
            GROUP,
            VERSION,
            spec.plural,
            id=handler_id,
            operations=list(spec.operations),
            side_effects=False,
            registry=registry,
        )

        def judged_first(handler: Handler) -> Handler:
            @functools.wraps(handler)
            async def judged(**kwargs: Any) -> None:
                reviewer = access().reviewer
                request, user = _request(kwargs), _user(kwargs)
                _enforce(
                    await judge_requester(request, user, plural=spec.plural, reviewer=reviewer)
                )
                # read from the review once: the handler gets them as it was judged
                await handler(request=request, user=user, **kwargs)

            register(judged)
            return judged

        return judged_first

    @webhook(VALIDATE_DEFINITION_HANDLER_ID)
    async def validate_workflow_definition(
        *, request: AdmissionRequest, user: UserInfo | None, **kwargs: Any
    ) -> None:
        verdict = await decide_definition_checks(
            request,
            registry=definitions(),
            user=user,
            checks=access(),
            creator=None if dry_run is None else dry_run(),
            warnings=kwargs.get("warnings"),
            budget=dry_run_budget,
        )
        _enforce(verdict)

    @webhook(VALIDATE_RUN_HANDLER_ID)
    async def validate_workflow_run(
        *, request: AdmissionRequest, user: UserInfo | None, **_: Any
    ) -> None:
        sources = None if runs is None else runs()
        _enforce(await decide_run(request, definitions(), runs=sources))
        checks = access()
        _enforce(await decide_run_access(request, user=user, checks=checks))
        _enforce(
            await decide_run_limits(
                request, definition=await _run_definition(request, checks), runs=sources
            )
        )

    @webhook(VALIDATE_SCHEDULE_HANDLER_ID)
    async def validate_workflow_schedule(
        *, request: AdmissionRequest, user: UserInfo | None, **_: Any
    ) -> None:
        checks = access()
        _enforce(
            await decide_schedule(request, definitions=definitions(), user=user, checks=checks)
        )

    @webhook(MUTATE_SCHEDULE_HANDLER_ID)
    async def record_workflow_schedule_author(
        *, patch: kopf.Patch, request: AdmissionRequest, **_: Any
    ) -> None:
        verdict = decide_schedule_mutation(request)
        _apply_to_patch(patch, verdict.patch)

    @webhook(MUTATE_RUN_HANDLER_ID)
    async def pin_workflow_run_version(
        *, patch: kopf.Patch, request: AdmissionRequest, **_: Any
    ) -> None:
        verdict = await decide_run_mutation(request, definitions())
        _enforce(verdict)
        _apply_to_patch(patch, verdict.patch)

    @webhook(VALIDATE_ACTION_HANDLER_ID)
    async def validate_workflow_run_action(
        *, request: AdmissionRequest, user: UserInfo | None, **_: Any
    ) -> None:
        reviewer = access().reviewer
        _enforce(await decide_action(request, user, reviewer=reviewer))

    @webhook(MUTATE_ACTION_HANDLER_ID)
    async def record_workflow_run_action_actor(
        *, patch: kopf.Patch, request: AdmissionRequest, user: UserInfo | None, **_: Any
    ) -> None:
        verdict = decide_action_mutation(request, user)
        _apply_to_patch(patch, verdict.patch)
