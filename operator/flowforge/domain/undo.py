"""What a rollback undoes: a compensator's ``compensateOn`` and the order of the steps.

A compensator undoes its forward task when the task succeeded. With ``compensateOn:
Attempted`` it also undoes a task whose last attempt failed after its container had started
(it may have charged the card before it crashed), and not one whose Pod never started (an
image that could not be pulled, a Pod that was never scheduled, a Job the apiserver refused):
nothing of it ran. Such an attempted task is the run's latest work, so its compensator runs
first, before those of the succeeded tasks (among several, in the rollback's usual order).
The compensator learns which case it is in from ``FLOWFORGE_UNDO_OF``: ``succeeded`` or
``attempted``.

Whether an attempt's container started is read from how it ended
(:func:`container_started`): a container exit code, or the attempt's deadline passing
(``activeDeadlineSeconds`` counts while the container runs; a Pod that never starts is
failed by the pending timeout first, with the Pod's own reason), means it started; the
Pod's reasons for not starting, a refused Job, a Kueue admission timeout, a vanished Job
and a failed Job whose Pods no longer tell an exit code mean it did not (or is not known to
have), and then nothing is undone.

The store's trigger (``flowforge.store.settle``) is held to :func:`undo_of` and its order
to :func:`rollback_order` by the model test (``tests/store/test_run_model.py``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import StrEnum

from flowforge.domain.execution import AttemptOutcome, OutcomeReason
from flowforge.domain.graph import DependencyGraph
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.states import TaskState

UNDO_OF_ENV = "FLOWFORGE_UNDO_OF"


class CompensateOn(StrEnum):
    """A compensator's ``compensateOn``."""

    SUCCEEDED = "Succeeded"
    ATTEMPTED = "Attempted"


class UndoOf(StrEnum):
    """Why a triggered compensator runs (its ``FLOWFORGE_UNDO_OF``)."""

    SUCCEEDED = "succeeded"
    ATTEMPTED = "attempted"


def undoes_attempted(spec: DefinitionSpec) -> list[str]:
    """The keys of the compensators of ``spec`` with ``compensateOn: Attempted``."""
    return sorted(
        task.key
        for task in spec.tasks
        if task.is_compensator and task.compensate_on == CompensateOn.ATTEMPTED
    )


def container_started(outcome: AttemptOutcome) -> bool:
    """Whether the attempt that ended with ``outcome`` got as far as running its container."""
    if outcome.succeeded or outcome.exit_code is not None:
        return True
    return outcome.reason in (OutcomeReason.EXIT_CODE, OutcomeReason.DEADLINE_EXCEEDED)


def undo_of(
    *, forward_state: TaskState, started: bool, compensate_on: CompensateOn
) -> UndoOf | None:
    """Whether a compensator runs when the rollback starts, and why; None when it is skipped.
    ``started``: whether the forward task's last attempt started its container."""
    if forward_state is TaskState.SUCCEEDED:
        return UndoOf.SUCCEEDED
    if forward_state is TaskState.FAILED and started and compensate_on is CompensateOn.ATTEMPTED:
        return UndoOf.ATTEMPTED
    return None


def rollback_order(
    graph: DependencyGraph,
    *,
    succeeded: Collection[str],
    attempted: Collection[str],
    compensators: Mapping[str, str],
) -> tuple[str, ...]:
    """The compensators a rollback runs, in order: those undoing attempted tasks first, then
    those of the succeeded tasks, each part a dependent's before its dependency's."""
    return graph.compensation_order(attempted, compensators) + graph.compensation_order(
        succeeded, compensators
    )
