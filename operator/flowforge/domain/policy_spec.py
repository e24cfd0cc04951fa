"""The ``spec`` of a FlowForgePolicy as a pydantic model, and its JSON Schema (the CRD's).

Caps may only lower the hard limits of `flowforge.domain.caps`: each is bounded by its
hard limit in the schema, so the apiserver refuses a policy that tries to raise one.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from flowforge.domain.caps import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    MAX_EDGES,
    MAX_ITEMS_PER_TASK,
    MAX_PARAMETER_VALUE_LENGTH,
    MAX_PARAMETERS,
    MAX_PARAMETERS_TOTAL_LENGTH,
    MAX_TASKS,
)
from flowforge.domain.run import MAX_PRIORITY

MAX_POLICY_ENTRIES: Final = 256
_SA_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_EFFECT_PATTERN: Final = r"^(NoSchedule|PreferNoSchedule|NoExecute)$"
# a name or glob a policy lists (the schema's item bounds, as the CRD's)
_Glob = Annotated[str, Field(min_length=1, max_length=512)]


class _PolicyModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class TolerationRule(_PolicyModel):
    """A toleration tasks may carry."""

    key: str = Field(
        min_length=1,
        max_length=316,
        description="The taint key tasks may tolerate; `*` allows any key, including the "
        "empty key that tolerates every taint.",
    )
    values: list[str] | None = Field(
        default=None,
        max_length=MAX_POLICY_ENTRIES,
        description="Values an `Equal` toleration may name; omitted allows any value and "
        "operator `Exists`.",
    )
    effects: list[str] | None = Field(
        default=None,
        max_length=3,
        description="Effects the toleration may name (NoSchedule, PreferNoSchedule, "
        "NoExecute); omitted allows any effect, including none (all effects).",
    )


class PolicyCaps(_PolicyModel):
    """Lower caps than FlowForge's hard limits; an omitted cap is the hard limit."""

    max_tasks: int | None = Field(default=None, ge=1, le=MAX_TASKS, description="Tasks.")
    max_edges: int | None = Field(
        default=None, ge=0, le=MAX_EDGES, description="dependsOn entries over all tasks."
    )
    max_parameters: int | None = Field(
        default=None, ge=0, le=MAX_PARAMETERS, description="Parameters of a run."
    )
    max_parameter_value_length: int | None = Field(
        default=None,
        ge=0,
        le=MAX_PARAMETER_VALUE_LENGTH,
        description="Characters of one parameter value.",
    )
    max_parameters_total_length: int | None = Field(
        default=None,
        ge=0,
        le=MAX_PARAMETERS_TOTAL_LENGTH,
        description="Characters of all parameter names and values together.",
    )
    max_config_bytes: int | None = Field(
        default=None, ge=2, le=MAX_CONFIG_BYTES, description="Bytes of a task's config as JSON."
    )
    max_config_depth: int | None = Field(
        default=None, ge=1, le=MAX_CONFIG_DEPTH, description="Nesting levels of a task's config."
    )
    max_parallel_tasks: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="Tasks of one run running at once: caps the definition's and the run's "
        "maxParallelTasks (a run without one is capped too).",
    )
    max_items_per_task: int | None = Field(
        default=None,
        ge=0,
        le=MAX_ITEMS_PER_TASK,
        description="Items of one forEach task in a run (decided when the run is created).",
    )


class PodSecurityRules(_PolicyModel):
    """What task types may loosen of the restricted Pod defaults; omitted: nothing."""

    privileged: bool = Field(
        default=False,
        description="Containers may be privileged (securityContext.privileged, Windows "
        "hostProcess).",
    )
    allow_privilege_escalation: bool = Field(
        default=False,
        description="Containers may set securityContext.allowPrivilegeEscalation: true.",
    )
    capabilities: list[str] = Field(
        default_factory=list,
        max_length=MAX_POLICY_ENTRIES,
        description="Linux capabilities containers may add (`*`: any). Default: none.",
    )
    host_namespaces: bool = Field(
        default=False, description="Pods may use hostNetwork, hostPID and hostIPC."
    )
    host_paths: list[str] = Field(
        default_factory=list,
        max_length=MAX_POLICY_ENTRIES,
        description="Host directories hostPath volumes may mount (each allows itself and "
        "what is below it). Default: none.",
    )
    run_as_root: bool = Field(
        default=False, description="Pods and containers may run as user 0 (runAsNonRoot: false)."
    )
    unconfined: bool = Field(
        default=False,
        description="Seccomp or AppArmor profile Unconfined, procMount Unmasked, and SELinux "
        "options beyond the container types.",
    )
    sysctls: list[str] = Field(
        default_factory=list,
        max_length=MAX_POLICY_ENTRIES,
        description="Sysctls the Pod may set (globs). Default: none.",
    )
    runtime_classes: list[str] = Field(
        default_factory=lambda: ["*"],
        max_length=MAX_POLICY_ENTRIES,
        description="RuntimeClasses task types may name (globs). Default: any.",
    )
    priority_classes: list[str] = Field(
        default_factory=lambda: ["*"],
        max_length=MAX_POLICY_ENTRIES,
        description="PriorityClasses task types may name (globs). Default: any.",
    )


class PolicySpec(_PolicyModel):
    """What the Jobs of this namespace's workflows may use (every policy of it applies)."""

    # A namespace with none allows only the `default` ServiceAccount, any registry, no
    # tolerations and no nodeSelector: the defaults of these fields.

    service_accounts: list[str] = Field(
        default_factory=lambda: ["default"],
        max_length=MAX_POLICY_ENTRIES,
        description="ServiceAccounts task types may name (`default` is what a task type "
        "naming none runs as). Whoever publishes or runs a workflow must also hold verb "
        "`use` on each named ServiceAccount.",
    )
    registries: list[str] = Field(
        default_factory=lambda: ["*"],
        max_length=MAX_POLICY_ENTRIES,
        description="Image globs: without `/` a registry host (`ghcr.io`, `*.corp.example`), "
        "with `/` a repository (`docker.io/library/*`). `busybox` is "
        "`docker.io/library/busybox`. Default: any.",
    )
    tolerations: list[TolerationRule] = Field(
        default_factory=list,
        max_length=MAX_POLICY_ENTRIES,
        description="Tolerations task types may carry. Default: none.",
    )
    node_selector: dict[str, list[str]] = Field(
        default_factory=dict,
        max_length=MAX_POLICY_ENTRIES,
        description="Node label keys task types may select on, each with the values allowed "
        "(`*`: any). Default: none.",
    )
    caps: PolicyCaps = Field(
        default_factory=PolicyCaps,
        description="Caps lower than FlowForge's hard limits (never higher).",
    )
    pod_security: PodSecurityRules = Field(
        default_factory=PodSecurityRules,
        description="What task types may loosen of the restricted Pod defaults (privileged, "
        "capabilities, host namespaces and paths, root, unconfined profiles, sysctls) and the "
        "runtime and priority classes they may name.",
    )
    queues: list[_Glob] = Field(
        default_factory=lambda: ["*"],
        max_length=MAX_POLICY_ENTRIES,
        description="Kueue LocalQueues (of this namespace) task types may queue in, by "
        "queueName (their own or the definition's); globs. Default: any.",
    )
    queue_required: bool = Field(
        default=False,
        description="Every task type must queue through Kueue (name a queueName, its own or "
        "the definition's), so no Job escapes the queues' quotas. Default: false.",
    )
    workload_priority_classes: list[_Glob] = Field(
        default_factory=lambda: ["*"],
        max_length=MAX_POLICY_ENTRIES,
        description="Kueue WorkloadPriorityClasses task types may name "
        "(workloadPriorityClass, their own or the definition's); globs. Default: any.",
    )
    max_priority: int | None = Field(
        default=None,
        ge=-MAX_PRIORITY,
        le=MAX_PRIORITY,
        description="The highest spec.priority a run of this namespace may ask for (where it "
        "waits in the namespace's queue). Default: the hard limit.",
    )
    max_running_runs: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Runs of this namespace running at once, all workflows together; a run "
        "over it is Queued (by spec.priority, then age) until one finishes. Unlimited when "
        "omitted.",
    )
    max_running_tasks: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Tasks (forward tasks and compensators) of this namespace's runs running "
        "at once; a released task over it waits for a slot. Unlimited when omitted.",
    )
    max_queued_runs: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Runs of this namespace waiting in its queue (Queued) at once; a new run "
        "is refused at admission while that many wait (it would queue behind them). "
        "Unlimited when omitted.",
    )
    max_task_rows: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000_000,
        description="Task rows (forward tasks, forEach items, compensators and finally tasks) "
        "the namespace's unfinished runs hold in the store together; a new run whose rows "
        "would pass it is refused at admission. Unlimited when omitted.",
    )


def _with_item_bounds(schema: dict[str, Any]) -> dict[str, Any]:
    """Bound every string of the policy (pydantic does not say it for list items)."""
    string_lists = {"serviceAccounts": _SA_PATTERN, "registries": None}
    properties = schema["properties"]
    for name, pattern in string_lists.items():
        items: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 512}
        if pattern is not None:
            items["pattern"] = pattern
        properties[name]["items"] = items
    properties["nodeSelector"]["additionalProperties"] = {
        "type": "array",
        "maxItems": MAX_POLICY_ENTRIES,
        "items": {"type": "string", "maxLength": 63},
    }
    rule = schema["$defs"]["TolerationRule"]["properties"]
    for branch in rule["values"]["anyOf"]:
        if branch.get("type") == "array":
            branch["items"] = {"type": "string", "maxLength": 63}
    for branch in rule["effects"]["anyOf"]:
        if branch.get("type") == "array":
            branch["items"] = {"type": "string", "pattern": _EFFECT_PATTERN}
    pods = schema["$defs"]["PodSecurityRules"]["properties"]
    for name in ("capabilities", "hostPaths", "sysctls", "runtimeClasses", "priorityClasses"):
        pods[name]["items"] = {"type": "string", "minLength": 1, "maxLength": 512}
    return schema


POLICY_SPEC_SCHEMA: Final[dict[str, Any]] = _with_item_bounds(
    PolicySpec.model_json_schema(by_alias=True, mode="validation")
)
