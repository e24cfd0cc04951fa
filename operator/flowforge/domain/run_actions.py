"""``WorkflowRunAction``: a person's decision about a run, and the rules it is judged by.

One namespaced kind (short name ``wfa``) for every decision a person makes about a run:

```yaml
spec:
  run: deploy-4711
  action: SkipCompensator   # Approve | Reject | RetryCompensator | SkipCompensator | Pause | Resume
  compensator: refund       # the halted one, for RetryCompensator and SkipCompensator
  task: approve-prod        # the gate, for Approve and Reject
  reason: "refund done by hand, ticket OPS-1234"   # required for Reject and SkipCompensator
status: {actor: {username, groups}, result: Accepted|Refused, message, processedAt}
```

The admission webhook records who asked (the review's ``userInfo``; nobody else can write
it) and checks the custom verb of the action on ``workflowruns`` with the run as
``resourceName`` (:data:`VERBS`). The operator processes each action once, in creation
order, inside the run's transaction (``flowforge.store.actions``).

**Recovering a halted rollback.** A compensator that fails for good halts the rollback: the
compensators after it are skipped and the run ends ``Failed``. ``RetryCompensator`` runs the
halted compensator again with fresh attempts; ``SkipCompensator`` marks it skipped by a
person (the reason is required). Either way the compensators the halt skipped are pending
again and the rollback goes on in its order; the run stays ``Failed``, and when the rollback
has settled its history says it finished after a person acted. A person's moves are not the
engine's (``flowforge.domain.states``), so they have a table of their own
(:data:`RECOVERY_TRANSITIONS`).

**Pause and Resume.** While a run is paused no task and no compensator starts (released
tasks wait ``ready``, a triggered rollback waits with its compensators pending); running Jobs
finish and their outcomes are recorded, timeouts keep counting, and a run whose work is all
done still finishes. A cancel asked while it is paused (``spec.cancel``) is kept and applied
when it is resumed.

**Approve and Reject** decide an approval gate (``flowforge.domain.approval``): an
approval by one of its approvers counts once per person, ``required`` of them pass it; a
rejection fails it and the run rolls back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from flowforge.domain.k8s_grammar import DNS1123_SUBDOMAIN_PATTERN
from flowforge.domain.states import TERMINAL_RUN_PHASES, CompensationState, RunPhase

KIND: Final = "WorkflowRunAction"
PLURAL: Final = "workflowrunactions"
SHORT_NAME: Final = "wfa"
MAX_REASON_LENGTH: Final = 1024
# the annotation the webhook owns: who asked, as the review's userInfo said (JSON)
ACTOR_ANNOTATION: Final = "flowforge.io/actor"
_RUN_NAME: Final = re.compile(DNS1123_SUBDOMAIN_PATTERN)


class RunActionKind(StrEnum):
    APPROVE = "Approve"
    REJECT = "Reject"
    RETRY_COMPENSATOR = "RetryCompensator"
    SKIP_COMPENSATOR = "SkipCompensator"
    PAUSE = "Pause"
    RESUME = "Resume"


class ActionResult(StrEnum):
    ACCEPTED = "Accepted"
    REFUSED = "Refused"


# the custom verb on workflowruns (resourceName: the run) a person needs for each action
VERBS: Mapping[RunActionKind, str] = MappingProxyType(
    {
        RunActionKind.APPROVE: "approve",
        RunActionKind.REJECT: "approve",
        RunActionKind.RETRY_COMPENSATOR: "recover",
        RunActionKind.SKIP_COMPENSATOR: "recover",
        RunActionKind.PAUSE: "pause",
        RunActionKind.RESUME: "pause",
    }
)
RECOVERY_ACTIONS: Final = frozenset(
    {RunActionKind.RETRY_COMPENSATOR, RunActionKind.SKIP_COMPENSATOR}
)
PAUSE_ACTIONS: Final = frozenset({RunActionKind.PAUSE, RunActionKind.RESUME})
GATE_ACTIONS: Final = frozenset({RunActionKind.APPROVE, RunActionKind.REJECT})
_NEEDS_COMPENSATOR = RECOVERY_ACTIONS
_NEEDS_TASK = GATE_ACTIONS
_NEEDS_REASON = frozenset({RunActionKind.REJECT, RunActionKind.SKIP_COMPENSATOR})

# the moves of a compensator that only a person's action makes: the halted one runs again
# (failed -> pending, attempt + 1) or is skipped by a person (failed -> skipped); the ones
# the halt skipped are pending again (skipped -> pending)
RECOVERY_TRANSITIONS: Mapping[CompensationState, frozenset[CompensationState]] = MappingProxyType(
    {
        CompensationState.FAILED: frozenset({CompensationState.PENDING, CompensationState.SKIPPED}),
        CompensationState.SKIPPED: frozenset({CompensationState.PENDING}),
    }
)

SPEC_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "description": "A person's decision about a WorkflowRun of the same namespace.",
    "additionalProperties": False,
    "required": ["run", "action"],
    "properties": {
        "run": {
            "type": "string",
            "description": "The name of the WorkflowRun the action is about.",
            "minLength": 1,
            "maxLength": 253,
        },
        "action": {
            "type": "string",
            "description": "What to do: Approve or Reject a gate, RetryCompensator or "
            "SkipCompensator a halted compensator, Pause or Resume the run.",
            "enum": [kind.value for kind in RunActionKind],
        },
        "task": {
            "type": "string",
            "description": "The approval gate's task key (Approve, Reject).",
            "minLength": 1,
            "maxLength": 63,
        },
        "compensator": {
            "type": "string",
            "description": "The halted compensator's task key (RetryCompensator, SkipCompensator).",
            "minLength": 1,
            "maxLength": 63,
        },
        "reason": {
            "type": "string",
            "description": "Why: required for Reject and SkipCompensator; kept in the run's "
            "history.",
            "maxLength": MAX_REASON_LENGTH,
        },
    },
}

STATUS_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "description": "What the operator decided, and who asked (set by FlowForge only).",
    "properties": {
        "actor": {
            "type": "object",
            "description": "Who created the action, as the apiserver authenticated them.",
            "properties": {
                "username": {"type": "string", "description": "The user's name."},
                "groups": {
                    "type": "array",
                    "description": "The user's groups.",
                    "items": {"type": "string"},
                },
            },
        },
        "result": {
            "type": "string",
            "description": "Accepted (applied) or Refused (nothing changed).",
            "enum": [result.value for result in ActionResult],
        },
        "message": {"type": "string", "description": "What was done, or why not."},
        "processedAt": {
            "type": "string",
            "description": "When the operator processed the action.",
            "format": "date-time",
        },
    },
}


@dataclass(frozen=True)
class RunAction:
    """A parsed ``spec`` of a WorkflowRunAction."""

    run: str
    action: RunActionKind
    task: str | None = None
    compensator: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class Actor:
    username: str
    groups: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"username": self.username, "groups": list(self.groups)}


def parse_action(spec: Mapping[str, Any]) -> tuple[RunAction | None, list[tuple[str, str]]]:
    """The action of a ``spec``, or the refusals (path, message) that name the fields."""
    errors: list[tuple[str, str]] = []
    unknown = sorted(set(spec) - set(SPEC_SCHEMA["properties"]))
    errors.extend((f"spec.{name}", "unknown field") for name in unknown)
    run = spec.get("run")
    if not isinstance(run, str) or len(run) > 253 or not _RUN_NAME.match(run):
        errors.append(("spec.run", "must name a WorkflowRun (a DNS-1123 subdomain)"))
    try:
        kind = RunActionKind(str(spec.get("action")))
    except ValueError:
        allowed = ", ".join(kind.value for kind in RunActionKind)
        return None, [*errors, ("spec.action", f"must be one of {allowed}")]
    texts: dict[str, str] = {}
    for field in ("task", "compensator", "reason"):
        value = spec.get(field)
        if value is not None and not isinstance(value, str):
            errors.append((f"spec.{field}", "must be a string"))
        elif isinstance(value, str):
            texts[field] = value
    for field, needed in (("compensator", _NEEDS_COMPENSATOR), ("task", _NEEDS_TASK)):
        if kind in needed and not texts.get(field):
            errors.append((f"spec.{field}", f"is required for {kind.value}"))
        elif kind not in needed and field in texts:
            errors.append((f"spec.{field}", f"is not used by {kind.value}"))
    reason = texts.get("reason", "")
    if kind in _NEEDS_REASON and not reason.strip():
        errors.append(("spec.reason", f"is required for {kind.value}"))
    if len(reason) > MAX_REASON_LENGTH:
        errors.append(("spec.reason", f"must be at most {MAX_REASON_LENGTH} characters"))
    if errors:
        return None, errors
    assert isinstance(run, str)
    action = RunAction(
        run=run,
        action=kind,
        task=texts.get("task"),
        compensator=texts.get("compensator"),
        reason=reason,
    )
    return action, []


def recovery_refusal(
    *,
    phase: RunPhase,
    compensating: bool,
    compensator: str,
    states: Mapping[str, CompensationState],
) -> str | None:
    """Why a RetryCompensator/SkipCompensator of ``compensator`` cannot be applied to a run
    (its phase, whether it is rolling back, its compensators' states); None when it can."""
    if phase not in TERMINAL_RUN_PHASES or compensating:
        return "the run's rollback is not halted: it has not finished"
    failed = sorted(key for key, state in states.items() if state is CompensationState.FAILED)
    if not failed:
        return f"the run's rollback is not halted (the run is {phase.value})"
    if compensator not in states:
        return f'the run has no compensator "{compensator}"'
    if compensator not in failed:
        return f'the rollback halted at "{failed[0]}", not at "{compensator}"'
    return None


def pause_refusal(*, action: RunActionKind, phase: RunPhase, paused: bool) -> str | None:
    """Why a Pause or Resume cannot be applied to a run in ``phase`` (``paused``: whether it
    is paused now); None when it can."""
    if phase in TERMINAL_RUN_PHASES:
        return f"the run has finished ({phase.value}): there is nothing to {action.value.lower()}"
    if action is RunActionKind.PAUSE and paused:
        return "the run is paused already"
    if action is RunActionKind.RESUME and not paused:
        return "the run is not paused"
    return None
