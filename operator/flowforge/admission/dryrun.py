"""The apiserver judges every task type's template when a definition is applied.

For each distinct template of a WorkflowDefinition being created, admission builds the Job a
task of that type would get (`flowforge.kube.jobs.build_job`, for a placeholder run, without
the ownerReference to it) and the Pod that Job would make, and asks the apiserver to create
both with ``dryRun=All``: PodSpec validation answers for the Job; Pod Security (enforced on
Pods only, never on a Job), the ServiceAccount's existence, LimitRanges and the cluster's own
policies on Pods answer for the Pod. Nothing is stored. The placeholder run has no
parameters and its task no config, so its Job has the downward API volume of the run's
files (`flowforge.domain.run_files`); a real run's may mount its ConfigMap instead, which
validation and admission do not look up either (only the kubelet does). A refusal is mapped back
onto the definition's field (``spec.taskTypes[py].env[2].name``, `flowforge.kube.job_paths`).

Cost is bounded: one Job and one Pod dry-run per distinct template (identical task types share
one), at most ``concurrency`` at a time, all within ``timeout`` seconds. A definition with more
than ``MAX_TEMPLATES`` distinct templates is refused at ``spec.taskTypes`` before any dry-run
(judging the rest by the schema only would admit templates the apiserver never saw), and each
requester (the review's ``userInfo.username``) has a budget of dry-runs (`DryRunBudget`, a
token bucket: 64 a minute); a definition that would go over it is refused, naming the budget,
without a dry-run. What is transient is
not the template's fault and is not held against it: a quota exceeded right now, a name that
exists. An apiserver that does not answer in time is a refusal that says so (fail closed, as
the access reviews are): the definition is not admitted unchecked.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import ValidationError

from flowforge.admission.review import CODE_INVALID, MAX_LISTED_ERRORS, AdmissionRequest, Verdict
from flowforge.domain.models import ContainerTemplate
from flowforge.domain.states import TaskRole
from flowforge.kube.dryrun import DryRunAnswer, DryRunCreator
from flowforge.kube.job_paths import template_path
from flowforge.kube.jobs import JobRequest, build_job, template_env_positions

CODE_UNAVAILABLE: Final = 503
CODE_TOO_MANY: Final = 429
# distinct templates dry-run for one review: each costs a Job's and a Pod's dry-run
MAX_TEMPLATES: Final = 16
# what one requester may have dry-run: a burst of this many, refilled over a minute
DRY_RUNS_PER_MINUTE: Final = 64
# requesters whose buckets are remembered; a full bucket is forgotten first
MAX_REQUESTERS: Final = 4096
DEFAULT_TIMEOUT_SECONDS: Final = 5.0
DEFAULT_CONCURRENCY: Final = 8
# A run that cannot exist: the Job's owner and name are those of no real run.
PLACEHOLDER_RUN: Final = "flowforge-dry-run"
PLACEHOLDER_UID: Final = "00000000-0000-0000-0000-000000000000"
_TRANSIENT_MARKERS: Final = ("exceeded quota",)
# A refusal without a field that names a missing object: the template field that names it.
_NAMED_OBJECTS: Final = (
    ("service account", "serviceAccountName"),
    ("PriorityClass", "priorityClassName"),
    ("RuntimeClass", "runtimeClassName"),
)


@dataclass(frozen=True)
class TemplateCheck:
    """The Job and Pod of one distinct template, and the task types that share it."""

    type_names: tuple[str, ...]
    request: JobRequest
    job: dict[str, Any]

    @property
    def pod(self) -> dict[str, Any]:
        template = self.job["spec"]["template"]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**template["metadata"], **_names(self.job)},
            "spec": template["spec"],
        }


def _names(job: Mapping[str, Any]) -> dict[str, str]:
    return {"name": job["metadata"]["name"], "namespace": job["metadata"]["namespace"]}


def template_checks(
    namespace: str, task_types: Mapping[str, Mapping[str, Any]]
) -> list[TemplateCheck]:
    """One check per distinct template (camelCase documents, as the launcher hands them)."""
    by_content: dict[str, list[str]] = {}
    for name in sorted(task_types):
        key = json.dumps(task_types[name], sort_keys=True, separators=(",", ":"))
        by_content.setdefault(key, []).append(name)
    checks = []
    for names in by_content.values():
        request = JobRequest(
            namespace=namespace,
            run_name=PLACEHOLDER_RUN,
            run_uid=PLACEHOLDER_UID,
            task_key=names[0],
            attempt=1,
            role=TaskRole.FORWARD,
            template=task_types[names[0]],
        )
        job = build_job(request)
        # the placeholder run does not exist; owning by it would only ask the webhook's own
        # right to block its deletion (OwnerReferencesPermissionEnforcement), no template's
        del job["metadata"]["ownerReferences"]
        checks.append(TemplateCheck(type_names=tuple(names), request=request, job=job))
    return checks


@dataclass
class DryRunBudget:
    """Dry-runs each requester may still cause: a token bucket per username holding at most
    ``per_minute`` tokens, refilled at ``per_minute`` a minute. Taking is all or nothing."""

    per_minute: int = DRY_RUNS_PER_MINUTE
    clock: Callable[[], float] = time.monotonic
    max_requesters: int = MAX_REQUESTERS
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)

    def _tokens(self, user: str, now: float) -> float:
        tokens, since = self._buckets.get(user, (self.per_minute, now))
        return min(self.per_minute, tokens + (now - since) * self.per_minute / 60.0)

    def take(self, user: str, count: int) -> float | None:
        """None when ``count`` dry-runs were taken from ``user``'s budget; else the seconds
        until the budget holds them (nothing taken)."""
        now = self.clock()
        tokens = self._tokens(user, now)
        if tokens < count:
            return (count - tokens) * 60.0 / self.per_minute
        self._forget_full(now)
        self._buckets.pop(user, None)  # re-inserted last: the oldest are forgotten first
        self._buckets[user] = (tokens - count, now)
        return None

    def _forget_full(self, now: float) -> None:
        if len(self._buckets) < self.max_requesters:
            return
        self._buckets = {
            user: bucket
            for user, bucket in self._buckets.items()
            if self._tokens(user, now) < self.per_minute
        }
        while len(self._buckets) >= self.max_requesters:
            del self._buckets[next(iter(self._buckets))]


@dataclass(frozen=True)
class Finding:
    lines: tuple[str, ...] = ()
    unavailable: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def _is_transient(answer: DryRunAnswer) -> bool:
    return answer.status == 409 or (
        answer.status == 403 and any(marker in answer.message for marker in _TRANSIENT_MARKERS)
    )


def _judge(check: TemplateCheck, kind: str, answer: DryRunAnswer) -> Finding:
    warnings = tuple(f"{kind} of task type {check.type_names[0]}: {w}" for w in answer.warnings)
    if answer.accepted:
        return Finding(warnings=warnings)
    if answer.status is None or answer.status == 429 or answer.status >= 500:
        return Finding(unavailable=(f"the dry-run of its {kind} got {answer.message}",))
    if _is_transient(answer):
        note = f"{kind} of task type {check.type_names[0]} not checked now: {answer.message}"
        return Finding(warnings=(*warnings, note))
    positions = template_env_positions(check.request)
    lines = []
    for type_name in check.type_names:
        base = f"spec.taskTypes[{type_name}]"
        for cause in answer.causes:
            path = template_path(
                cause.field, kind=kind, template_path=base, env_positions=positions
            )
            where = path or f"{base} ({kind} field {cause.field})"
            lines.append(f"{where}: {cause.message} (the apiserver refuses the task's {kind})")
        if not answer.causes:
            where = next(
                (f"{base}.{field}" for word, field in _NAMED_OBJECTS if word in answer.message),
                base,
            )
            lines.append(f"{where}: the apiserver refuses the task's {kind}: {answer.message}")
    return Finding(lines=tuple(lines), warnings=warnings)


async def _dry_run_all(
    checks: list[TemplateCheck], *, creator: DryRunCreator, concurrency: int
) -> list[Finding]:
    gate = asyncio.Semaphore(concurrency)

    async def one(check: TemplateCheck, kind: str) -> Finding:
        manifest = check.job if kind == "Job" else check.pod
        async with gate:
            answer = await creator.create(manifest)
        return _judge(check, kind, answer)

    kinds = ("Job", "Pod")
    answers = await asyncio.gather(*(one(check, kind) for check in checks for kind in kinds))
    findings = []
    for index in range(0, len(answers), len(kinds)):
        job, pod = answers[index], answers[index + 1]
        # the Job's validation holds the whole Pod spec's: its refusal says it once
        findings += (
            [job, Finding(unavailable=pod.unavailable, warnings=pod.warnings)]
            if job.lines
            else [job, pod]
        )
    return findings


def _over_bounds(
    request: AdmissionRequest, *, checks: list[TemplateCheck], budget: DryRunBudget | None
) -> Verdict | None:
    """The refusal when the review would cost more dry-runs than it or its requester may."""
    if len(checks) > MAX_TEMPLATES:
        return Verdict.deny(
            f"spec.taskTypes: {len(checks)} distinct task templates; at most {MAX_TEMPLATES} "
            "are checked by the apiserver's dry-run for one definition (identical task types "
            "share one): make task types that differ only by name identical, or split the "
            "workflow",
            code=CODE_INVALID,
        )
    if budget is None:
        return None
    cost = 2 * len(checks)  # a Job and a Pod each
    wait = budget.take(request.user, cost)
    if wait is None:
        return None
    return Verdict.deny(
        f"too many dry-runs: {request.user or 'an anonymous requester'} may cause "
        f"{budget.per_minute} dry-run creations a minute and this definition needs {cost}; "
        f"try again in {math.ceil(wait)} s",
        code=CODE_TOO_MANY,
    )


async def decide_definition_dry_run(
    request: AdmissionRequest,
    *,
    creator: DryRunCreator,
    warnings: list[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    concurrency: int = DEFAULT_CONCURRENCY,
    budget: DryRunBudget | None = None,
) -> Verdict:
    """On CREATE: every distinct template's Job and Pod pass the apiserver's dry-run.
    ``warnings`` (the AdmissionReview's) gets what the apiserver warned about; ``budget``
    (none: unbounded) is charged for the requester before anything is asked."""
    if request.operation != "CREATE":
        return Verdict.allow()
    spec = request.new_object.get("spec") if request.new_object else None
    raw_types = spec.get("taskTypes") if isinstance(spec, Mapping) else None
    try:
        task_types = {
            str(name): ContainerTemplate.model_validate(raw).model_dump(
                mode="json", by_alias=True, exclude_none=True
            )
            for name, raw in (raw_types or {}).items()
        }
    except (ValidationError, AttributeError):
        return Verdict.allow()  # admission.decide_definition has denied it, naming why
    checks = template_checks(request.namespace, task_types)
    refused = _over_bounds(request, checks=checks, budget=budget)
    if refused is not None:
        return refused
    try:
        findings = await asyncio.wait_for(
            _dry_run_all(checks, creator=creator, concurrency=concurrency), timeout
        )
    except TimeoutError:
        return Verdict.deny(
            f"cannot check the task types now: the apiserver did not answer their dry-run "
            f"within {timeout:g} s; try again",
            code=CODE_UNAVAILABLE,
        )
    if warnings is not None:
        warnings.extend(warning for finding in findings for warning in finding.warnings)
    unavailable = [line for finding in findings for line in finding.unavailable]
    if unavailable:
        return Verdict.deny(
            f"cannot check the task types now: {unavailable[0]}; try again", code=CODE_UNAVAILABLE
        )
    lines = list(dict.fromkeys(line for finding in findings for line in finding.lines))
    if not lines:
        return Verdict.allow()
    listed = lines[:MAX_LISTED_ERRORS]
    if len(lines) > MAX_LISTED_ERRORS:
        listed.append(f"... and {len(lines) - MAX_LISTED_ERRORS} more")
    noun = "error" if len(lines) == 1 else "errors"
    return Verdict.deny(
        f"invalid WorkflowDefinition ({len(lines)} {noun} from the apiserver's dry-run):\n"
        + "\n".join(listed),
        code=CODE_INVALID,
    )
