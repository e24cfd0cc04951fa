"""The namespace policy (FlowForgePolicy) and its pure evaluation against definitions and runs.

A FlowForgePolicy is written by cluster admins only (as a ResourceQuota is): the chart's
tenant roles may read it, never write it. It lists what the Jobs of a namespace's workflows
may use: ServiceAccounts, image registries (globs, every image of the Pod), tolerations and
node selectors, Kueue queues and WorkloadPriorityClasses, a run's highest priority, and caps
that lower (never raise) the hard limits of `flowforge.domain.caps`.

Every policy of a namespace applies (their intersection). A namespace with none gets
``Policy.default``: only the `default` ServiceAccount, any registry, no tolerations and no
nodeSelector, any queue and priority class, the hard caps.

Admission judges a definition's task types (``definition_violations``) and a run's
parameters and priority; the operator judges each Job again before it creates it
(``job_refusal``), with the same ``task_type_violations``, against the policies as they are
then.

Evaluation returns every violation, each naming the field of the definition (or run) and
the policy that refuses it, e.g.
``spec.taskTypes.py.image: registry evil.io is not allowed by policy team-a/flowforge``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from flowforge.domain.caps import config_text, nesting_depth
from flowforge.domain.expansion import Expansion
from flowforge.domain.kueue import QueueDefaults, queueing
from flowforge.domain.models import ContainerTemplate, DefinitionSpec
from flowforge.domain.policy_images import (
    ANY,
    ImageReference,
    parse_image,
    registry_allowed,
    template_images,
)
from flowforge.domain.policy_pods import pod_security_findings, required_node_labels
from flowforge.domain.policy_spec import PodSecurityRules, PolicyCaps, PolicySpec, TolerationRule

DEFAULT_SERVICE_ACCOUNT: Final = "default"
# violations a refused Job's message names (its attempt's message stays short)
MAX_NAMED_VIOLATIONS: Final = 5


@dataclass(frozen=True)
class Policy:
    """One FlowForgePolicy object: where it lives and what it says."""

    namespace: str
    name: str
    spec: PolicySpec

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}" if self.name else self.namespace

    @classmethod
    def default(cls, namespace: str) -> Policy:
        return cls(namespace=namespace, name="", spec=PolicySpec())

    def describe(self) -> str:
        if not self.name:
            return f"the default policy of namespace {self.namespace} (it has no FlowForgePolicy)"
        return f"policy {self.label}"


@dataclass(frozen=True)
class Violation:
    """One field a policy refuses."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def _tolerated(toleration: Mapping[str, Any], rule: TolerationRule) -> bool:
    key = str(toleration.get("key") or "")
    if rule.key != ANY and rule.key != key:
        return False
    if toleration.get("operator") == "Exists":
        if rule.values is not None:
            return False
    elif rule.values is not None and str(toleration.get("value") or "") not in rule.values:
        return False
    effect = str(toleration.get("effect") or "")
    return rule.effects is None or (effect != "" and effect in rule.effects)


def _describe_toleration(toleration: Mapping[str, Any]) -> str:
    key = toleration.get("key") or "(any key)"
    operator = toleration.get("operator") or "Equal"
    value = "" if operator == "Exists" else f"={toleration.get('value') or ''}"
    effect = toleration.get("effect") or "(any effect)"
    return f"{key} {operator}{value} {effect}"


def template_violations(
    template: ContainerTemplate, *, path: str, policies: Sequence[Policy]
) -> list[Violation]:
    """What the policies refuse in one task type's template (``path`` names it)."""
    found: list[Violation] = []
    images = list(template_images(template, path=path))
    account = template.service_account_name or DEFAULT_SERVICE_ACCOUNT
    for policy in policies:
        spec, by = policy.spec, policy.describe()
        for at, image in images:
            found.extend(_image_violations(image, at=at, registries=spec.registries, by=by))
        if account not in spec.service_accounts:
            named = "" if template.service_account_name else " (none named: the default)"
            found.append(
                Violation(
                    f"{path}.serviceAccountName",
                    f"serviceaccount {account!r}{named} is not allowed by {by} "
                    "(its spec.serviceAccounts)",
                )
            )
        for index, toleration in enumerate(template.tolerations or ()):
            if not any(_tolerated(toleration, rule) for rule in spec.tolerations):
                found.append(
                    Violation(
                        f"{path}.tolerations[{index}]",
                        f"toleration {_describe_toleration(toleration)} is not allowed by {by}",
                    )
                )
        for key in sorted(template.node_selector or {}):
            value = (template.node_selector or {})[key]
            allowed = spec.node_selector.get(key)
            if allowed is None:
                message = f"node label {key!r} is not allowed by {by}"
            elif ANY not in allowed and value not in allowed:
                message = (
                    f"value {value!r} of node label {key!r} is not allowed by {by} "
                    "(its spec.nodeSelector)"
                )
            else:
                continue
            found.append(Violation(f"{path}.nodeSelector.{key}", message))
        found.extend(_affinity_violations(template, path=path, spec=spec, by=by))
        found.extend(
            Violation(at, f"{what} is not allowed by {by}")
            for at, what in pod_security_findings(template, path=path, rules=spec.pod_security)
        )
    return found


def _queue_violations(
    spec: QueueDefaults, type_name: str, *, path: str, policies: Sequence[Policy]
) -> list[Violation]:
    """The Kueue queue and WorkloadPriorityClass a task type's Jobs get (its own, else the
    definition's), each refused at the field that names it."""
    template = spec.task_types[type_name]
    queued = queueing(spec, type_name)
    queue_at = f"{path}.queueName" if template.queue_name else "spec.queueName"
    class_at = (
        f"{path}.workloadPriorityClass"
        if template.workload_priority_class
        else "spec.workloadPriorityClass"
    )
    found: list[Violation] = []
    for policy in policies:
        rules, by = policy.spec, policy.describe()
        if queued is None:
            if rules.queue_required:
                found.append(
                    Violation(
                        f"{path}.queueName",
                        f"names no Kueue queue (nor does spec.queueName); {by} requires one",
                    )
                )
            continue
        if not _glob(queued.queue_name, rules.queues):
            found.append(
                Violation(queue_at, f"LocalQueue {queued.queue_name!r} is not allowed by {by}")
            )
        if queued.priority_class is not None and not _glob(
            queued.priority_class, rules.workload_priority_classes
        ):
            found.append(
                Violation(
                    class_at,
                    f"WorkloadPriorityClass {queued.priority_class!r} is not allowed by {by}",
                )
            )
    return found


def _glob(value: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(value, pattern) for pattern in patterns)


def task_type_violations(
    spec: QueueDefaults, type_name: str, policies: Sequence[Policy]
) -> list[Violation]:
    """What the policies refuse in the Jobs of one task type: its template (every image,
    ServiceAccount, tolerations, node choice, Pod-security loosenings) and its Kueue queue
    and priority class. The one check admission runs for each task type of a definition and
    the operator runs again before it creates each Job (``spec``: the definition, full or
    compact)."""
    path = f"spec.taskTypes.{type_name}"
    template = spec.task_types[type_name]
    return template_violations(template, path=path, policies=policies) + _queue_violations(
        spec, type_name, path=path, policies=policies
    )


def _image_violations(image: object, *, at: str, registries: list[str], by: str) -> list[Violation]:
    if registries == [ANY]:
        return []
    reference = parse_image(image) if isinstance(image, str) else None
    if reference is None:
        return [Violation(at, f"is not a valid image reference ({by} allows only some registries)")]
    if registry_allowed(reference, registries):
        return []
    return [
        Violation(
            at,
            f"registry {reference.registry} is not allowed by {by} (image "
            f"{reference.repository}; its spec.registries)",
        )
    ]


def _affinity_violations(
    template: ContainerTemplate, *, path: str, spec: PolicySpec, by: str
) -> list[Violation]:
    """A required node affinity chooses nodes as a nodeSelector does: the same rules hold."""
    found = []
    for at, key, values in required_node_labels(template, path=path):
        allowed = spec.node_selector.get(key)
        if allowed is None:
            found.append(Violation(f"{at}.key", f"node label {key!r} is not allowed by {by}"))
        elif ANY not in allowed and (values is None or not set(values) <= set(allowed)):
            shown = "any value" if values is None else ", ".join(map(repr, values))
            found.append(
                Violation(
                    at,
                    f"{shown} of node label {key!r} is not allowed by {by} (its spec.nodeSelector)",
                )
            )
    return found


def _cap(policies: Sequence[Policy], field: str) -> tuple[int, Policy] | None:
    """The lowest value of one cap over the policies that set it, and the policy."""
    best: tuple[int, Policy] | None = None
    for policy in policies:
        value = getattr(policy.spec.caps, field)
        if value is not None and (best is None or value < best[0]):
            best = (value, policy)
    return best


def _over(
    policies: Sequence[Policy], field: str, *, actual: int, path: str, what: str
) -> list[Violation]:
    cap = _cap(policies, field)
    if cap is None or actual <= cap[0]:
        return []
    limit, policy = cap
    return [Violation(path, f"has {actual} {what}; {policy.describe()} allows at most {limit}")]


def definition_violations(
    definition: DefinitionSpec, policies: Sequence[Policy]
) -> list[Violation]:
    """Every violation of ``definition`` against the namespace's policies (in field order).

    ``policies`` empty means the namespace has none: pass ``[Policy.default(namespace)]``.
    """
    found: list[Violation] = []
    for name in sorted(definition.task_types):
        for violation in task_type_violations(definition, name, policies):
            if violation not in found:  # spec.queueName, shared by task types
                found.append(violation)
    found += _over(
        policies, "max_tasks", actual=len(definition.tasks), path="spec.tasks", what="tasks"
    )
    edges = sum(len(task.depends_on) for task in definition.tasks)
    found += _over(
        policies, "max_edges", actual=edges, path="spec.tasks", what="dependsOn entries in total"
    )
    depth_cap = _cap(policies, "max_config_depth")
    for index, task in enumerate(definition.tasks):
        path = f"spec.tasks[{index}].config"
        if depth_cap is not None:
            depth = nesting_depth(task.config, limit=depth_cap[0])
            found += _over(
                policies, "max_config_depth", actual=depth, path=path, what="levels of nesting"
            )
        size = len(config_text(task.config))
        found += _over(policies, "max_config_bytes", actual=size, path=path, what="bytes as JSON")
    return found


def parameter_violations(
    parameters: Mapping[str, str], policies: Sequence[Policy]
) -> list[Violation]:
    """What the policies' caps refuse in a run's parameters."""
    found = _over(
        policies,
        "max_parameters",
        actual=len(parameters),
        path="spec.parameters",
        what="parameters",
    )
    total = sum(len(name) + len(value) for name, value in parameters.items())
    found += _over(
        policies,
        "max_parameters_total_length",
        actual=total,
        path="spec.parameters",
        what="characters in names and values",
    )
    for name in sorted(parameters):
        found += _over(
            policies,
            "max_parameter_value_length",
            actual=len(parameters[name]),
            path=f"spec.parameters[{name}]",
            what="characters",
        )
    return found


def expansion_violations(
    definition: DefinitionSpec, expansion: Expansion, policies: Sequence[Policy]
) -> list[Violation]:
    """What the policies' caps refuse in a run's shape: a forEach with more items than
    ``maxItemsPerTask``."""
    index_of = {task.key: index for index, task in enumerate(definition.tasks)}
    found: list[Violation] = []
    for key, members in expansion.groups.items():
        found += _over(
            policies,
            "max_items_per_task",
            actual=len(members),
            path=f"spec.tasks[{index_of[key]}].forEach.items",
            what="items",
        )
    return found


def priority_violations(priority: int, policies: Sequence[Policy]) -> list[Violation]:
    """What the policies refuse in a run's ``spec.priority``: more than a ``maxPriority``."""
    return [
        Violation(
            "spec.priority",
            f"priority {priority} is higher than {policy.describe()} allows "
            f"(maxPriority {policy.spec.max_priority})",
        )
        for policy in policies
        if policy.spec.max_priority is not None and priority > policy.spec.max_priority
    ]


@dataclass(frozen=True)
class Holdings:
    """What a namespace's runs hold in the store now: the runs in its queue, and the task
    rows of its unfinished runs."""

    queued_runs: int
    task_rows: int


def holding_violations(
    holdings: Holdings, *, rows: int, policies: Sequence[Policy]
) -> list[Violation]:
    """What the policies refuse of a new run of ``rows`` task rows given what the namespace
    holds: a queue already at ``maxQueuedRuns``, or more rows than ``maxTaskRows``."""
    found: list[Violation] = []
    for policy in policies:
        queued, held = policy.spec.max_queued_runs, policy.spec.max_task_rows
        if queued is not None and holdings.queued_runs >= queued:
            found.append(
                Violation(
                    "spec",
                    f"{holdings.queued_runs} runs of the namespace are queued; "
                    f"{policy.describe()} allows at most {queued} (maxQueuedRuns): "
                    "try again when runs have left the queue",
                )
            )
        if held is not None and holdings.task_rows + rows > held:
            found.append(
                Violation(
                    "spec",
                    f"the run has {rows} task rows and the namespace's unfinished runs hold "
                    f"{holdings.task_rows}; {policy.describe()} allows at most {held} "
                    "(maxTaskRows)",
                )
            )
    return found


def named_service_accounts(definition: DefinitionSpec) -> list[tuple[str, str]]:
    """(field path, ServiceAccount) for every task type naming one other than ``default``:
    the requester must be allowed to ``use`` each (a Pod naming none runs as ``default``,
    which anyone who may create Jobs gets anyway)."""
    return sorted(
        (f"spec.taskTypes.{name}.serviceAccountName", template.service_account_name)
        for name, template in definition.task_types.items()
        if template.service_account_name
        and template.service_account_name != DEFAULT_SERVICE_ACCOUNT
    )


def read_policies(
    objects: Sequence[Mapping[str, Any]], *, namespace: str
) -> tuple[list[Policy], list[str]]:
    """The namespace's policies, and a problem for each object that cannot be read (a policy
    that cannot be read refuses everything: it fails closed)."""
    policies: list[Policy] = []
    problems: list[str] = []
    for obj in objects:
        metadata = obj.get("metadata") or {}
        name = str(metadata.get("name") or "?")
        try:
            spec = PolicySpec.model_validate(obj.get("spec") or {})
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            where = ".".join(str(part) for part in first["loc"])
            problems.append(
                f"FlowForgePolicy {namespace}/{name} is invalid (spec.{where}: {first['msg']}); "
                "nothing runs in this namespace until a cluster admin fixes it"
            )
            continue
        policies.append(Policy(namespace=namespace, name=name, spec=spec))
    return policies, problems


def job_refusal(
    spec: QueueDefaults,
    type_name: str,
    *,
    namespace: str,
    policies: Sequence[Policy],
    problems: Sequence[str],
) -> str | None:
    """Why the namespace's policies, as they are now, refuse a Job of the task type (None
    when they allow it): a policy that cannot be read refuses every Job, else each violation
    of ``task_type_violations`` (the check admission ran) is named."""
    lines = list(problems) or [
        str(violation)
        for violation in task_type_violations(
            spec, type_name, policies_or_default(policies, namespace=namespace)
        )
    ]
    if not lines:
        return None
    shown = lines[:MAX_NAMED_VIOLATIONS]
    if len(lines) > MAX_NAMED_VIOLATIONS:
        shown.append(f"... and {len(lines) - MAX_NAMED_VIOLATIONS} more")
    return "; ".join(shown)


def policies_or_default(policies: Sequence[Policy], *, namespace: str) -> list[Policy]:
    return list(policies) or [Policy.default(namespace)]


__all__ = [
    "DEFAULT_SERVICE_ACCOUNT",
    "ImageReference",
    "PodSecurityRules",
    "Policy",
    "PolicyCaps",
    "PolicySpec",
    "TolerationRule",
    "Violation",
    "definition_violations",
    "expansion_violations",
    "job_refusal",
    "named_service_accounts",
    "parameter_violations",
    "parse_image",
    "policies_or_default",
    "priority_violations",
    "read_policies",
    "registry_allowed",
    "task_type_violations",
]
