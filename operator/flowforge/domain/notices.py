"""The Kubernetes Events FlowForge posts on a WorkflowRun: reasons and messages, in one place.

Pure functions of what a move decided; ``kubectl describe wfr`` and the reasons' names are
what users read, so they are kept stable.
"""

from __future__ import annotations

from collections.abc import Sequence

from flowforge.domain.decision import Notice
from flowforge.domain.for_each import PARTIAL_FAILURE
from flowforge.domain.states import CompensationState, RunPhase


def run_started(
    *, workflow: str, version: int, tasks: int, only: tuple[str, str] | None = None
) -> Notice:
    """``only``: the one task of a single-task run and its first Job, whose start this Event
    tells in ``task_started``'s words instead of an Event of its own."""
    text = f"running {workflow} v{version} ({tasks} tasks)"
    if only is not None:
        text += f"; {task_started(task_key=only[0], attempt=1, job=only[1]).message}"
    return Notice("RunStarted", text)


def run_admitted() -> Notice:
    return Notice(reason="RunStarted", message="left the queue: a slot is free")


def run_replaced(*, by: str) -> Notice:
    return Notice(
        reason="RunReplaced",
        message=f"cancelled to make room for run {by} (spec.concurrency.policy Replace)",
    )


def run_refused(message: str) -> Notice:
    return Notice("RunRefused", message, warning=True)


def task_started(*, task_key: str, attempt: int, job: str) -> Notice:
    return Notice("TaskStarted", f"task {task_key} attempt {attempt}: Job {job}")


def task_admitted(*, task_key: str, attempt: int, job: str) -> Notice:
    return Notice("TaskAdmitted", f"task {task_key} attempt {attempt}: Kueue admitted Job {job}")


def task_evicted(*, task_key: str, attempt: int, job: str) -> Notice:
    return Notice(
        "TaskEvicted",
        f"task {task_key} attempt {attempt}: Kueue suspended Job {job} again (evicted or "
        "preempted); it waits for admission, the attempt is not failed",
    )


def job_creation_delayed(
    *, task_key: str, attempt: int, job: str, message: str, retry_in: float
) -> Notice:
    return Notice(
        "JobCreationDelayed",
        f"task {task_key} attempt {attempt}: Job {job} could not be created yet, "
        f"trying again in {retry_in:.0f} s: {message}",
        warning=True,
    )


def policy_refused(*, task_key: str, attempt: int, job: str, message: str) -> Notice:
    return Notice(
        "PolicyRefused",
        f"task {task_key} attempt {attempt}: Job {job} not created, the namespace's policy "
        f"refuses it now: {message}",
        warning=True,
    )


def compensation_started(*, task_key: str, compensates: str, attempt: int, job: str) -> Notice:
    return Notice(
        "CompensationStarted",
        f"compensator {task_key} (undoing {compensates}) attempt {attempt}: Job {job}",
    )


def task_failed(
    *,
    task_key: str,
    attempt: int,
    reason: str,
    message: str,
    final: bool,
    skipped: Sequence[str] = (),
) -> Notice:
    outcome = "failed" if final else "failed, will retry"
    text = f"task {task_key} attempt {attempt} {outcome}: {reason}: {message}"
    if skipped:
        text += f"; skipped {', '.join(skipped)}"
    return Notice("TaskFailed" if final else "TaskRetrying", text, warning=True)


def item_failure_tolerated(*, task_key: str, group: str, failed: int, tolerance: int) -> Notice:
    """A forEach item failed within its task's ``tolerateFailures`` (`for_each.py`)."""
    return Notice(
        PARTIAL_FAILURE,
        f"item {task_key} of {group} failed within tolerateFailures ({failed} of at most "
        f"{tolerance} failed); {group} still counts as succeeded and its dependents run",
        warning=True,
    )


def items_stopped(*, group: str, failed: int, tolerance: int, stopped: int) -> Notice:
    """More items of a forEach failed than its ``tolerateFailures``: the rest were cancelled."""
    return Notice(
        "ItemsStopped",
        f"{failed} items of {group} failed, more than its tolerateFailures ({tolerance}): no "
        f"new item starts, {stopped} running cancelled; the run fails",
        warning=True,
    )


def compensation_finished(
    *,
    task_key: str,
    compensates: str,
    attempt: int,
    state: CompensationState,
    reason: str,
    message: str,
    halted: Sequence[str] = (),
) -> Notice:
    what = f"compensator {task_key} (undoing {compensates}) attempt {attempt}"
    if state is CompensationState.SUCCEEDED:
        return Notice("CompensationSucceeded", f"{what} succeeded")
    if state is CompensationState.PENDING:
        return Notice("CompensationRetrying", f"{what} failed, will retry: {message}", True)
    not_run = f"; not run: {', '.join(halted)}" if halted else ""
    return Notice(
        "CompensationFailed",
        f"{what} failed, rollback halted: {reason}: {message}{not_run}",
        warning=True,
    )


def run_cancelling(*, reason: str, stopped: int) -> Notice:
    return Notice("RunCancelling", f"{reason}: stopped {stopped} running tasks")


def rollback_started(order: Sequence[str]) -> Notice:
    return Notice(
        "RollbackStarted", "undoing what succeeded, one at a time: " + " -> ".join(order), True
    )


def action_processed(*, action: str, actor: str, accepted: bool, message: str) -> Notice:
    """A person's WorkflowRunAction was applied to the run, or refused."""
    if accepted:
        return Notice("ActionAccepted", f"{action} by {actor}: {message}")
    return Notice("ActionRefused", f"{action} by {actor} refused: {message}", warning=True)


def rollback_recovered(*, halted_at: str | None) -> Notice:
    """A rollback a person recovered has settled (the run keeps its phase)."""
    if halted_at is None:
        return Notice("RollbackCompleted", "the rollback finished after a person acted")
    return Notice(
        "CompensationFailed",
        f"the recovered rollback halted again at {halted_at}",
        warning=True,
    )


def run_finished(phase: RunPhase) -> Notice:
    return Notice(
        f"Run{phase.value}",
        f"run finished: {phase.value}",
        warning=phase is not RunPhase.SUCCEEDED,
    )


def cancel_deferred(*, reason: str) -> Notice:
    return Notice(
        "CancelDeferred",
        f"cancel asked ({reason}) while the run is paused: it is applied when the run is resumed",
    )


def run_duplicate(phase: RunPhase) -> Notice:
    """A duplicate (spec.idempotencyKey) took its original's final phase without executing."""
    return Notice(
        f"Run{phase.value}",
        f"duplicate of an earlier run with the same spec.idempotencyKey, which ended "
        f"{phase.value}: this run did not execute",
        warning=phase is not RunPhase.SUCCEEDED,
    )


# why a Job that claims one of the run's attempts is not the run's own
_NOT_OURS = {
    "namespace": "it is in another namespace than the run",
    "uid": "its uid is not the one recorded when the attempt's Job was created",
    "name": "its name is not the attempt's Job name",
    "owner": "the run is not its controller owner",
}
# what believing it would have done
_WOULD = {
    "outcome": "its outcome was not recorded",
    "vanished": "its deletion was not taken for a lost attempt",
    "cleanup": "it was not deleted",
    "adopt": "it was not taken for the attempt's Job, which waits until the name is free",
}


def forged_config_map(*, name: str, uid: str, task_key: str, attempt: int) -> Notice:
    """The run's ConfigMap was deleted and re-created by someone else (another uid)."""
    return Notice(
        "ForgedConfigMap",
        f"ConfigMap {name} (uid {uid}) is not the one this run created: someone deleted and "
        f"re-created it; task {task_key} attempt {attempt} fails rather than mount it",
        warning=True,
    )


def forged_pod(*, namespace: str, name: str, task_key: str, attempt: int) -> Notice:
    """A running Pod of the run's Job had the annotation its files are read from changed."""
    return Notice(
        "ForgedPod",
        f"Pod {namespace}/{name}'s files annotation was changed after FlowForge made it: task "
        f"{task_key} attempt {attempt} fails and its Job is deleted",
        warning=True,
    )


def forged_job(
    *,
    namespace: str,
    name: str,
    uid: str,
    task_key: str,
    attempt: int,
    cause: str,
    act: str,
) -> Notice:
    """A Job copied this run's labels and annotations (``cause``: namespace, uid, name or
    owner) and was ignored (``act``: outcome, vanished, cleanup or adopt)."""
    return Notice(
        "ForgedJob",
        f"ignored Job {namespace}/{name} (uid {uid}) claiming task {task_key} attempt "
        f"{attempt}: {_NOT_OURS.get(cause, cause)}; {_WOULD.get(act, act)}",
        warning=True,
    )


def awaiting_approval(*, gates: Sequence[str]) -> Notice:
    """Approval gates whose upstreams succeeded wait for people (`approval.py`)."""
    return Notice(
        "AwaitingApproval",
        f"waiting for approval: {', '.join(gates)} (flowforge approve RUN TASK)",
    )


def gate_approved(*, gate: str, approvers: Sequence[str]) -> Notice:
    return Notice("ApprovalGranted", f"{gate} approved by {', '.join(approvers)}")


def gate_failed(*, gate: str, reason: str, message: str, skipped: Sequence[str] = ()) -> Notice:
    """An approval gate was rejected, or its timeout passed: it failed for good."""
    text = f"approval gate {gate} failed: {reason}: {message}"
    if skipped:
        text += f"; skipped {', '.join(skipped)}"
    return Notice(reason, text, warning=True)


def finalizing(*, phase: str, rollback: str, tasks: Sequence[str]) -> Notice:
    """The run's outcome is decided: its ``finally`` tasks run before it takes it."""
    return Notice(
        "Finalizing",
        f"outcome {phase} (rollback: {rollback}); running finally: {' -> '.join(tasks)}",
    )


def final_task_finished(*, task_key: str, attempt: int, succeeded: bool, message: str) -> Notice:
    if succeeded:
        return Notice("FinallySucceeded", f"finally task {task_key} attempt {attempt} succeeded")
    return Notice(
        "FinallyFailed",
        f"finally task {task_key} attempt {attempt} failed: {message} (the run's phase stands)",
        warning=True,
    )
