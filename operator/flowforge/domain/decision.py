"""What a store move decided, as plain data: the one vocabulary between deciding and acting.

Every move of a run (dispatch, record an outcome, cancel, settle, the next compensation
step) is one PostgreSQL transaction in ``flowforge.store`` that returns a ``Decision``. The
operator's applier (``flowforge.operator.applier``) performs its effects after the commit,
always in the same order: stop Jobs, create Jobs, post Events, count, re-project the
status, set a wake-up. A move that lost a race (the attempt was already recorded, the run
is over) returns ``Decision.lost()``: never an exception.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Protocol

from flowforge.domain.states import TERMINAL_RUN_PHASES, RunPhase, TaskRole


class AttemptRow(Protocol):
    """A task row read from the store, as far as its running attempt goes."""

    @property
    def run_id(self) -> int: ...
    @property
    def task_key(self) -> str: ...
    @property
    def role(self) -> TaskRole: ...
    @property
    def attempt(self) -> int: ...
    @property
    def timeout_seconds(self) -> int | None: ...
    @property
    def not_before(self) -> datetime: ...


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """An attempt the store moved to running: its Job is to be created."""

    run_id: int
    task_key: str
    role: TaskRole
    attempt: int
    timeout_seconds: int | None
    released_at: datetime

    @classmethod
    def of(cls, row: AttemptRow) -> Dispatch:
        """The running attempt of a task row."""
        return cls(
            run_id=row.run_id,
            task_key=row.task_key,
            role=row.role,
            attempt=row.attempt,
            timeout_seconds=row.timeout_seconds,
            released_at=row.not_before,
        )


@dataclasses.dataclass(frozen=True)
class JobRef:
    """The Job of one attempt (its name follows from the run and these)."""

    task_key: str
    attempt: int
    role: TaskRole = TaskRole.FORWARD


@dataclasses.dataclass(frozen=True)
class Notice:
    """A Kubernetes Event to post on the WorkflowRun."""

    reason: str
    message: str
    warning: bool = False


@dataclasses.dataclass(frozen=True)
class Outcome:
    """Which attempt's outcome a move recorded (for metrics and the finished Job's TTL)."""

    job: JobRef
    reason: str
    job_gone: bool = False  # a vanished Job: nothing left to delete


@dataclasses.dataclass(frozen=True)
class Decision:
    recorded: bool
    create_jobs: tuple[Dispatch, ...] = ()
    stop_jobs: tuple[JobRef, ...] = ()
    notices: tuple[Notice, ...] = ()
    outcome: Outcome | None = None
    phase: RunPhase | None = None  # the run's phase after the move, when it finished
    # a retry or the next compensator (or gate timeout) is due in that many seconds,
    # measured by the store on the database's clock (the one that set the due time)
    wake_in: float | None = None
    # what the same transaction decided for other runs: a slot this move freed started a
    # queued run (or the ready tasks of another run of the namespace), a Replace cancelled
    # an older run; each is applied like a decision of its own
    elsewhere: tuple[RunDecision, ...] = ()
    # only the run's place in the queue moved (another run left or joined it): its status is
    # re-projected too, folded with the queue's other moves (``operator/status.py``)
    queue_moved: bool = False

    @classmethod
    def lost(cls) -> Decision:
        """The move changed nothing: another path (a replayed event, the reconciler, a
        cancel) got there first, or the run is over."""
        return cls(recorded=False)

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL_RUN_PHASES

    def then(self, later: Decision) -> Decision:
        """This decision followed by ``later`` (from the same transaction, or the settle
        after a committed outcome)."""
        if not later.recorded:
            return self
        wakes = [delay for delay in (self.wake_in, later.wake_in) if delay is not None]
        return Decision(
            recorded=self.recorded or later.recorded,
            create_jobs=self.create_jobs + later.create_jobs,
            stop_jobs=self.stop_jobs + later.stop_jobs,
            notices=self.notices + later.notices,
            outcome=self.outcome or later.outcome,
            phase=later.phase or self.phase,
            wake_in=min(wakes) if wakes else None,
            elsewhere=self.elsewhere + later.elsewhere,
            queue_moved=self.queue_moved and later.queue_moved,
        )

    def also(self, others: tuple[RunDecision, ...]) -> Decision:
        """This decision, and what the same transaction decided for other runs."""
        if not others:
            return self
        return dataclasses.replace(self, recorded=True, elsewhere=self.elsewhere + others)


@dataclasses.dataclass(frozen=True)
class RunDecision:
    """A decision about another run than the one the move was about."""

    run_id: int
    decision: Decision
