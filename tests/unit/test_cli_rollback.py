"""``flowforge rollback retry|skip RUN COMPENSATOR``, ``flowforge pause|resume RUN`` and
``flowforge approve|reject RUN TASK``: the WorkflowRunAction each creates, and what it refuses
before asking the cluster."""

from __future__ import annotations

import pytest

from flowforge.cli.main import build_parser
from flowforge.cli.output import CommandError
from flowforge.cli.rollback import action_body


def test_skip_creates_a_skip_compensator_action_with_the_reason() -> None:
    args = build_parser().parse_args(
        ["rollback", "skip", "pay-1", "refund", "--reason", "done by hand, OPS-1234"]
    )

    body = action_body(args)

    assert args.command_name == "rollback skip"
    assert body["kind"] == "WorkflowRunAction"
    assert body["metadata"] == {"generateName": "pay-1-skip-"}
    assert body["spec"] == {
        "run": "pay-1",
        "action": "SkipCompensator",
        "compensator": "refund",
        "reason": "done by hand, OPS-1234",
    }


def test_retry_needs_no_reason() -> None:
    args = build_parser().parse_args(["rollback", "retry", "pay-1", "refund"])

    assert action_body(args)["spec"] == {
        "run": "pay-1",
        "action": "RetryCompensator",
        "compensator": "refund",
    }


def test_skip_without_a_reason_is_refused_naming_the_field() -> None:
    args = build_parser().parse_args(["rollback", "skip", "pay-1", "refund"])

    with pytest.raises(CommandError, match=r"spec\.reason: is required for SkipCompensator"):
        action_body(args)


@pytest.mark.parametrize(("verb", "kind"), [("pause", "Pause"), ("resume", "Resume")])
def test_pause_and_resume_create_their_action_on_the_run(verb: str, kind: str) -> None:
    args = build_parser().parse_args([verb, "deploy-4711", "--reason", "freeze window"])

    body = action_body(args)

    assert args.command_name == verb
    assert body["metadata"] == {"generateName": f"deploy-4711-{verb}-"}
    assert body["spec"] == {"run": "deploy-4711", "action": kind, "reason": "freeze window"}


def test_approve_names_the_gate() -> None:
    args = build_parser().parse_args(["approve", "deploy-4711", "approve-prod"])

    body = action_body(args)

    assert args.command_name == "approve"
    assert body["spec"] == {"run": "deploy-4711", "action": "Approve", "task": "approve-prod"}


def test_reject_without_a_reason_is_refused_naming_the_field() -> None:
    args = build_parser().parse_args(["reject", "deploy-4711", "approve-prod"])

    with pytest.raises(CommandError, match=r"spec\.reason: is required for Reject"):
        action_body(args)
    args = build_parser().parse_args(
        ["reject", "deploy-4711", "approve-prod", "--reason", "prod is frozen"]
    )
    assert action_body(args)["spec"]["reason"] == "prod is frozen"
