"""WorkflowRunAction's rules: its spec (refusals name the field) and when a recovery of a
halted rollback may be applied."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.run_actions import (
    RECOVERY_TRANSITIONS,
    VERBS,
    RunAction,
    RunActionKind,
    parse_action,
    recovery_refusal,
)
from flowforge.domain.states import COMPENSATION_TRANSITIONS, CompensationState, RunPhase

FAILED, SKIPPED = CompensationState.FAILED, CompensationState.SKIPPED


def test_a_skip_with_a_reason_parses() -> None:
    spec = {"run": "pay-1", "action": "SkipCompensator", "compensator": "refund", "reason": "x"}
    assert parse_action(spec) == (
        RunAction(
            run="pay-1", action=RunActionKind.SKIP_COMPENSATOR, compensator="refund", reason="x"
        ),
        [],
    )


@pytest.mark.parametrize(
    ("spec", "errors"),
    [
        (
            {"run": "pay-1", "action": "SkipCompensator", "compensator": "refund"},
            [("spec.reason", "is required for SkipCompensator")],
        ),
        (
            {"run": "pay-1", "action": "SkipCompensator", "compensator": "r", "reason": "  "},
            [("spec.reason", "is required for SkipCompensator")],
        ),
        (
            {"run": "pay-1", "action": "RetryCompensator"},
            [("spec.compensator", "is required for RetryCompensator")],
        ),
        (
            {"run": "pay-1", "action": "RetryCompensator", "compensator": "r", "task": "t"},
            [("spec.task", "is not used by RetryCompensator")],
        ),
        ({"run": "Not_A_Name", "action": "Pause"}, [("spec.run", "must name a WorkflowRun")]),
        ({"run": "pay-1", "action": "Explode"}, [("spec.action", "must be one of")]),
        ({"run": "pay-1", "action": "Pause", "actor": "root"}, [("spec.actor", "unknown field")]),
        (
            {"run": "pay-1", "action": "Reject", "task": "gate", "reason": "x" * 1025},
            [("spec.reason", "must be at most 1024 characters")],
        ),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(
    spec: dict[str, Any], errors: list[tuple[str, str]]
) -> None:
    action, found = parse_action(spec)
    assert action is None
    assert [
        (path, message[: len(want)])
        for (path, message), (_, want) in zip(found, errors, strict=True)
    ] == errors


def test_recovery_needs_a_run_that_ended_with_its_rollback_halted_at_that_compensator() -> None:
    halted = {"undeploy": FAILED, "unprovision": SKIPPED}

    def refusal(**overrides: Any) -> str | None:
        arguments: dict[str, Any] = {
            "phase": RunPhase.FAILED,
            "compensating": False,
            "compensator": "undeploy",
            "states": halted,
        }
        return recovery_refusal(**(arguments | overrides))

    assert refusal() is None
    assert "not halted" in str(refusal(phase=RunPhase.RUNNING))
    assert "not halted" in str(refusal(compensating=True))
    assert "not halted" in str(refusal(states={"undeploy": CompensationState.SUCCEEDED}))
    assert 'halted at "undeploy"' in str(refusal(compensator="unprovision"))
    assert "no compensator" in str(refusal(compensator="nope"))


def test_a_persons_moves_are_not_the_engines() -> None:
    for state, targets in RECOVERY_TRANSITIONS.items():
        assert not targets & COMPENSATION_TRANSITIONS[state]


def test_every_action_has_its_verb() -> None:
    assert set(VERBS) == set(RunActionKind)
    assert VERBS[RunActionKind.RETRY_COMPENSATOR] == VERBS[RunActionKind.SKIP_COMPENSATOR]
    assert VERBS[RunActionKind.SKIP_COMPENSATOR] == "recover"
