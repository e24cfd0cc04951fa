"""The JSON Schema (Draft 2020-12) of a WorkflowDefinition's ``spec``, as data.

It is the one description of the shape: the validator here, the admission webhook and the
CustomResourceDefinition (generated from it) all use it. It deliberately sticks to keywords a
Kubernetes structural schema can express (no ``$ref``, no ``propertyNames``); ``uniqueItems``
must become ``x-kubernetes-list-type: set`` when the CRD is generated. The ``x-kubernetes-*``
keys are annotations for that generation and mean nothing to JSON Schema.
"""

from __future__ import annotations

from typing import Any, Final

from flowforge.domain.caps import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    MAX_CONFIGS_TOTAL_BYTES,
    MAX_ITEMS_PER_TASK,
    MAX_PARAMETERS,
    MAX_TASKS,
)
from flowforge.domain.k8s_grammar import (
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_PATTERN,
    LABEL_VALUE_PATTERN,
    NON_BLANK_PATTERN,
)
from flowforge.domain.podspec_schema import KUBERNETES_VERSION, TEMPLATE_FIELDS

TASK_KEY_MAX_LENGTH: Final = 50
MAX_TASK_TYPES: Final = 256
MAX_RETRIES: Final = 100
MAX_TIMEOUT_SECONDS: Final = 30 * 24 * 3600
MAX_VERSION: Final = 2**31 - 1
MAX_EXPRESSION_LENGTH: Final = 1024


def _task_key(description: str) -> dict[str, Any]:
    return {
        "type": "string",
        "description": description,
        "minLength": 1,
        "maxLength": TASK_KEY_MAX_LENGTH,
        "pattern": DNS1123_LABEL_PATTERN,
    }


def _string_map(description: str, *, max_value_length: int, max_entries: int) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "maxProperties": max_entries,
        "additionalProperties": {"type": "string", "maxLength": max_value_length},
    }


def _string_list(description: str, *, max_items: int) -> dict[str, Any]:
    return {
        "type": "array",
        "description": description,
        "maxItems": max_items,
        "items": {"type": "string", "maxLength": 32_768},
    }


def _label_map(description: str, *, max_entries: int) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "maxProperties": max_entries,
        "additionalProperties": {
            "type": "string",
            "maxLength": 63,
            "pattern": LABEL_VALUE_PATTERN,
        },
    }


_ANNOTATION_VALUE_LENGTH: Final = 65_536

_OWN_TEMPLATE_FIELDS: Final[dict[str, Any]] = {
    "image": {
        "type": "string",
        "description": "The container image, e.g. python:3.12-slim.",
        "minLength": 1,
        "maxLength": 1024,
        "pattern": NON_BLANK_PATTERN,
    },
    "command": _string_list(
        "The container's entrypoint; the image's ENTRYPOINT when omitted.", max_items=256
    ),
    "args": _string_list(
        "Arguments to the entrypoint; the image's CMD when omitted.", max_items=256
    ),
    "annotations": _string_map(
        "Annotations added to the task's Pod.",
        max_value_length=_ANNOTATION_VALUE_LENGTH,
        max_entries=128,
    ),
    "labels": _label_map("Labels added to the task's Pod.", max_entries=64),
    "jobMetadata": {
        "type": "object",
        "description": "Labels and annotations added to the task's Job (labels and "
        "annotations above go to its Pod). Keys under kueue.x-k8s.io/ are dropped: only "
        "queueName and workloadPriorityClass, which the namespace's policy governs, say how "
        "a Job queues.",
        "additionalProperties": False,
        "properties": {
            "labels": _label_map("Labels added to the task's Job.", max_entries=64),
            "annotations": _string_map(
                "Annotations added to the task's Job.",
                max_value_length=_ANNOTATION_VALUE_LENGTH,
                max_entries=128,
            ),
        },
    },
    "serviceAccountName": {
        "type": "string",
        "description": "The service account the task's Pod runs as.",
        "maxLength": 253,
        "pattern": DNS1123_SUBDOMAIN_PATTERN,
    },
    "pendingTimeoutSeconds": {
        "type": "integer",
        "minimum": 1,
        "maximum": 86400,
        "description": "Fail an attempt whose Pod has not started this many seconds "
        "after its Job was created (unschedulable, image not pulled, missing Secret), with "
        "the Pod's own reason; the operator's default (the chart's "
        "operator.pendingTimeoutSeconds) when absent.",
    },
    "automountServiceAccountToken": {
        "type": "boolean",
        "description": "Mount the ServiceAccount's API token into the task's Pod; not "
        "mounted unless true.",
    },
    "nodeSelector": _label_map("Node labels the task's Pod must be scheduled on.", max_entries=64),
}

MAX_ADMISSION_TIMEOUT_SECONDS: Final = 7 * 24 * 3600


def _kueue_properties(scope: str) -> dict[str, Any]:
    """The Kueue fields of a task type, and of the definition as the default of its types."""
    return {
        "queueName": {
            "type": "string",
            "description": f"The Kueue LocalQueue (in the run's namespace) that {scope} "
            "queue in: they are created suspended with the kueue.x-k8s.io/queue-name label "
            "and start when Kueue admits them (Admitting until then).",
            "minLength": 1,
            "maxLength": 63,
            "pattern": DNS1123_SUBDOMAIN_PATTERN,
        },
        "workloadPriorityClass": {
            "type": "string",
            "description": f"The Kueue WorkloadPriorityClass of {scope} (the "
            "kueue.x-k8s.io/priority-class label); only with a queueName.",
            "minLength": 1,
            "maxLength": 63,
            "pattern": DNS1123_SUBDOMAIN_PATTERN,
        },
        "admissionTimeoutSeconds": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_ADMISSION_TIMEOUT_SECONDS,
            "description": f"Fail an attempt of {scope} whose Job Kueue has not admitted "
            "this many seconds after it was created (or evicted); no limit when absent. "
            "timeoutSeconds and pendingTimeoutSeconds count from admission.",
        },
    }


CONTAINER_TEMPLATE_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "description": "The template of the Kubernetes Job that runs each task of this type: "
    "the task's container and its Pod, in the Pod spec's own field names (Kubernetes "
    f"{KUBERNETES_VERSION}; podSecurityContext is the Pod's securityContext).",
    "additionalProperties": False,
    "required": ["image"],
    "properties": {
        **_OWN_TEMPLATE_FIELDS,
        **TEMPLATE_FIELDS,
        **_kueue_properties("this type's Jobs"),
    },
}

MAX_APPROVERS: Final = 64
MAX_REQUIRED_APPROVALS: Final = 16
MAX_APPROVAL_TIMEOUT_SECONDS: Final = 30 * 24 * 3600

APPROVAL_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "description": "Makes the task an approval gate instead of a Job: once its upstreams "
    "succeeded it waits (the run's AwaitingApproval condition names it) until `required` "
    "people approve it with WorkflowRunActions (Approve), each once; a Reject, or the "
    "timeout, fails it (reasons Rejected, ApprovalTimedOut) and the run rolls back as for "
    "any failure. Not allowed with type, config, retries, timeoutSeconds, forEach or on a "
    "compensation task, and a gate has no compensator.",
    "additionalProperties": False,
    "properties": {
        "approvers": {
            "type": "object",
            "description": "Who may approve: a listed user, or a member of a listed group "
            "(each also needs the approve verb on the run). None: anyone with that verb.",
            "additionalProperties": False,
            "properties": {
                "users": {
                    "type": "array",
                    "description": "User names, as the apiserver authenticates them.",
                    "maxItems": MAX_APPROVERS,
                    "uniqueItems": True,
                    "items": {"type": "string", "minLength": 1, "maxLength": 253},
                },
                "groups": {
                    "type": "array",
                    "description": "Group names, as the apiserver authenticates them.",
                    "maxItems": MAX_APPROVERS,
                    "uniqueItems": True,
                    "items": {"type": "string", "minLength": 1, "maxLength": 253},
                },
            },
        },
        "required": {
            "type": "integer",
            "description": "How many different people must approve (default 1).",
            "minimum": 1,
            "maximum": MAX_REQUIRED_APPROVALS,
        },
        "forbidSelf": {
            "type": "boolean",
            "description": "The run's creator (flowforge.io/requested-by) may not approve it.",
        },
        "timeoutSeconds": {
            "type": "integer",
            "description": "How long the gate waits once its upstreams succeeded; none: "
            "until it is decided or the run is cancelled.",
            "minimum": 1,
            "maximum": MAX_APPROVAL_TIMEOUT_SECONDS,
        },
        "onTimeout": {
            "type": "string",
            "description": "What the timeout does: Reject (the gate fails, reason "
            "ApprovalTimedOut).",
            "enum": ["Reject"],
        },
    },
}

TASK_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "description": "One task: a forward task of the DAG, an approval gate, or the "
    "compensator of a forward task.",
    "additionalProperties": False,
    "required": ["key"],
    "properties": {
        "key": _task_key(
            "The task's name, unique in the definition; a DNS-1123 label of at most "
            f"{TASK_KEY_MAX_LENGTH} characters."
        ),
        "type": {
            "type": "string",
            "description": "The name of the entry of taskTypes whose template runs this "
            "task. Required, except on an approval gate (approval), which runs no Job.",
            "minLength": 1,
            "maxLength": 63,
            "pattern": DNS1123_LABEL_PATTERN,
        },
        "dependsOn": {
            "type": "array",
            "description": (
                "Keys of the forward tasks that must succeed before this one starts. "
                "Not allowed on a compensation task."
            ),
            "maxItems": MAX_TASKS,
            "uniqueItems": True,
            "items": _task_key("The key of a forward task this task depends on."),
        },
        "config": {
            "type": "object",
            "description": (
                "Free-form JSON object handed to the task's container as the file "
                f"$FLOWFORGE_CONFIG_FILE: at most {MAX_CONFIG_BYTES} bytes as JSON and "
                f"{MAX_CONFIG_DEPTH} levels deep; all of a definition's configs together at most "
                f"{MAX_CONFIGS_TOTAL_BYTES} bytes."
            ),
            "maxProperties": 1024,
            "x-kubernetes-preserve-unknown-fields": True,
        },
        "retries": {
            "type": "integer",
            "description": "How many times a failed attempt is retried (0: never).",
            "minimum": 0,
            "maximum": MAX_RETRIES,
        },
        "timeoutSeconds": {
            "type": "integer",
            "description": "How long one attempt may run before it counts as failed.",
            "minimum": 1,
            "maximum": MAX_TIMEOUT_SECONDS,
        },
        "compensateFor": _task_key(
            "Makes this a compensation task: the key of the forward task it undoes when a "
            "run fails after that task succeeded."
        ),
        "compensateOn": {
            "type": "string",
            "description": (
                "For a compensation task: `Succeeded` (the default) undoes its task only when "
                "it succeeded; `Attempted` also undoes it when its last attempt failed after "
                "its container had started (a step that failed half-way), first in the "
                "rollback. The compensator's FLOWFORGE_UNDO_OF says which: `succeeded` or "
                "`attempted`."
            ),
            "enum": ["Succeeded", "Attempted"],
        },
        "when": {
            "type": "string",
            "description": "A CEL expression over the declared parameters (params.NAME), "
            "e.g. params.mode == 'full': the task runs only when it is true. Decided when the "
            "run is created: a false one is skipped (reason ConditionFalse), its dependents "
            "run as if it had succeeded and its compensator never runs. Not allowed on a "
            f"compensation task; at most {MAX_EXPRESSION_LENGTH} characters.",
            "minLength": 1,
            "maxLength": MAX_EXPRESSION_LENGTH,
        },
        "forEach": {
            "type": "object",
            "description": "Runs the task once per item: one task instance per item, each "
            "with its own attempts, retries and Job, keyed task[itemKey] (the item itself "
            "when it is a short DNS-safe string, else a hash). The item reaches the "
            "container as FLOWFORGE_ITEM (JSON) and FLOWFORGE_ITEM_KEY. Dependents wait "
            "for every item; a compensator of the task runs once per item that succeeded, "
            "in reverse order of completion. Not allowed on a compensation task.",
            "additionalProperties": False,
            "required": ["items"],
            "properties": {
                "items": {
                    "description": "A CEL expression over the declared parameters that "
                    "gives a list (e.g. params.regions), or a literal list; at most "
                    f"{MAX_ITEMS_PER_TASK} items, decided when the run is created.",
                    "x-kubernetes-preserve-unknown-fields": True,
                },
                "maxParallel": {
                    "type": "integer",
                    "description": "At most this many items run at once (inside the run's "
                    "maxParallelTasks); none: as many as the run allows.",
                    "minimum": 1,
                    "maximum": MAX_TASKS,
                },
                "tolerateFailures": {
                    "description": "How many items may fail with the task still succeeding "
                    "(its dependents run, the run shows PartialFailure): a count, or a "
                    "percent of the items such as '10%' (rounded down). Past it no new item "
                    "starts, the running ones are cancelled and the run fails. Default 0.",
                    "anyOf": [
                        {"type": "integer", "minimum": 0, "maximum": MAX_TASKS},
                        {"type": "string", "pattern": r"^(100|[1-9]?[0-9])%$"},
                    ],
                    "x-kubernetes-int-or-string": True,
                },
                "key": {
                    "type": "string",
                    "description": "For object items: the field whose value names each "
                    "item (its key); the keys must be unique.",
                    "minLength": 1,
                    "maxLength": 253,
                },
            },
        },
        "approval": APPROVAL_SCHEMA,
    },
}

PARAMETER_NAME_PATTERN: Final = r"^[A-Za-z_][A-Za-z0-9_]*$"
PARAMETER_TYPES: Final = ("string", "integer", "number", "boolean", "array", "object")
MAX_ENUM_VALUES: Final = 256
# any JSON value (a default, an enum's values): checked against the declaration itself
_ANY_JSON: Final[dict[str, Any]] = {"x-kubernetes-preserve-unknown-fields": True}


def _bound(description: str) -> dict[str, Any]:
    return {"type": "number", "description": description}


PARAMETER_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "description": "A typed run parameter (a JSON Schema subset): a run's spec.parameters "
    "is checked against the declarations when it is applied, and records the defaults.",
    "additionalProperties": False,
    "required": ["name", "type"],
    "properties": {
        "name": {
            "type": "string",
            "description": "The parameter's name: letters, digits and _, not starting with a "
            "digit (CEL reads it as params.NAME).",
            "minLength": 1,
            "maxLength": 63,
            "pattern": PARAMETER_NAME_PATTERN,
        },
        "type": {
            "type": "string",
            "description": "The JSON type of the value.",
            "enum": list(PARAMETER_TYPES),
        },
        "description": {
            "type": "string",
            "description": "What the parameter means.",
            "maxLength": 4096,
        },
        "enum": {
            "type": "array",
            "description": "The only values allowed.",
            "minItems": 1,
            "maxItems": MAX_ENUM_VALUES,
            "items": _ANY_JSON,
        },
        "default": {
            **_ANY_JSON,
            "description": "The value a run that gives none gets (recorded with the run).",
        },
        "pattern": {
            "type": "string",
            "description": "A regular expression a string value must match (type string).",
            "minLength": 1,
            "maxLength": 1024,
        },
        "minimum": _bound("The smallest value allowed (type integer or number)."),
        "maximum": _bound("The largest value allowed (type integer or number)."),
        "minItems": {
            "type": "integer",
            "description": "The fewest items allowed (type array).",
            "minimum": 0,
            "maximum": 100_000,
        },
        "maxItems": {
            "type": "integer",
            "description": "The most items allowed (type array).",
            "minimum": 0,
            "maximum": 100_000,
        },
        "items": {
            "type": "object",
            "description": "The JSON Schema of each item (type array): type, enum, pattern, "
            "minimum, maximum, minItems, maxItems, items.",
            "maxProperties": 16,
            "x-kubernetes-preserve-unknown-fields": True,
        },
        "required": {
            "type": "boolean",
            "description": "A run must give this parameter (only without a default).",
        },
    },
}

MAX_PARALLEL_TASKS: Final = 10_000
MAX_CONCURRENT_RUNS: Final = 10_000
MAX_CONCURRENCY_KEY_PARAMETERS: Final = 8

MAX_PARALLEL_TASKS_SCHEMA: Final[dict[str, Any]] = {
    "type": "integer",
    "description": "At most this many tasks of one run (forward tasks and compensators alike) "
    "run at once; a run may lower it, the namespace's FlowForgePolicy caps it. Unlimited when "
    "omitted.",
    "minimum": 1,
    "maximum": MAX_PARALLEL_TASKS,
}

CONCURRENCY_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "description": "How many runs of this workflow may run at once, and what a run over the "
    "limit does. Counted over every version of the workflow in the namespace, per key.",
    "additionalProperties": False,
    "required": ["maxRuns"],
    "properties": {
        "maxRuns": {
            "type": "integer",
            "description": "Runs of this workflow (with the same key) running at once.",
            "minimum": 1,
            "maximum": MAX_CONCURRENT_RUNS,
        },
        "key": {
            "type": "array",
            "description": "Names of run parameters whose values form the key: the limit holds "
            "per distinct key (e.g. [tenant]: maxRuns per tenant). One key for all runs when "
            "omitted.",
            "minItems": 1,
            "maxItems": MAX_CONCURRENCY_KEY_PARAMETERS,
            "uniqueItems": True,
            "items": {"type": "string", "minLength": 1, "maxLength": 253},
        },
        "policy": {
            "type": "string",
            "description": "A run over the limit: Queue waits for a slot (the default), Forbid "
            "is refused when it is applied, Replace cancels the oldest running run of the key "
            "(which rolls back) and starts when it has finished.",
            "enum": ["Queue", "Forbid", "Replace"],
        },
    },
}

MAX_FINALLY_TASKS: Final = 16

FINALLY_SCHEMA: Final[dict[str, Any]] = {
    "type": "array",
    "description": "Tasks that run once the run's outcome is decided: after the forward "
    "tasks and after the rollback has settled, in list order, one at a time, each with its "
    "own retries and timeoutSeconds. Each gets the run's outcome (FLOWFORGE_RUN_OUTCOME: "
    "Succeeded, Failed or Cancelled; FLOWFORGE_ROLLBACK: None, Completed or Halted). They "
    "never change the run's phase, which is set once they have run. A finally task has a "
    "key (unique among all tasks), a type, and optionally config, retries and "
    "timeoutSeconds.",
    "maxItems": MAX_FINALLY_TASKS,
    "items": TASK_SCHEMA,
}

DEFINITION_SPEC_SCHEMA: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "description": "A versioned, immutable DAG of tasks, identified by (workflow, version).",
    "additionalProperties": False,
    "required": ["workflow", "version", "tasks"],
    "properties": {
        "workflow": {
            "type": "string",
            "description": "The workflow's name (a DNS-1123 label); with version, its identity.",
            "minLength": 1,
            "maxLength": 63,
            "pattern": DNS1123_LABEL_PATTERN,
        },
        "version": {
            "type": "integer",
            "description": (
                "The version of the workflow; a published version is immutable, so a "
                "change needs a new version."
            ),
            "minimum": 1,
            "maximum": MAX_VERSION,
        },
        "description": {
            "type": "string",
            "description": "What the workflow does; part of the fingerprint.",
            "maxLength": 4096,
        },
        "taskTypes": {
            "type": "object",
            "description": "Job templates by name; every task names one of them in its type.",
            "maxProperties": MAX_TASK_TYPES,
            "additionalProperties": CONTAINER_TEMPLATE_SCHEMA,
        },
        **_kueue_properties("the Jobs of task types that name no queue of their own"),
        "maxParallelTasks": MAX_PARALLEL_TASKS_SCHEMA,
        "concurrency": CONCURRENCY_SCHEMA,
        "parameters": {
            "type": "array",
            "description": "Typed parameters of the runs: a run gives values (JSON) for "
            "them, checked when it is applied. Without declarations a run's parameters are "
            "free string values.",
            "maxItems": MAX_PARAMETERS,
            "items": PARAMETER_SCHEMA,
        },
        "tasks": {
            "type": "array",
            "description": "The tasks: forward tasks and their compensators; at least one.",
            "minItems": 1,
            "maxItems": MAX_TASKS,
            "items": TASK_SCHEMA,
        },
        "finally": FINALLY_SCHEMA,
    },
}
