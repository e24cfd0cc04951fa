"""The pure model of a run that ``test_run_model.py`` holds the store to: the steps people
take (``Act``) and what the domain says every row and flag of a drawn run
(``model_dags.py``) is after a sequence of inputs (``RunModel``). Nothing here touches the
store; ``model_checker.py`` drives the store and compares."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Collection

from flowforge.domain.approval import GateReason, approval_refusal, rejection_refusal
from flowforge.domain.final_tasks import RollbackOutcome
from flowforge.domain.graph import DependencyGraph
from flowforge.domain.models import ApprovalSpec
from flowforge.domain.projection import TaskCounts, settled_phase
from flowforge.domain.run_actions import (
    Actor,
    RunActionKind,
    pause_refusal,
    recovery_refusal,
)
from flowforge.domain.states import (
    TERMINAL_COMPENSATION_STATES,
    TERMINAL_RUN_PHASES,
    UNRESOLVED_TASK_STATES,
    CompensationState,
    RunPhase,
    TaskRole,
    TaskState,
)
from flowforge.domain.undo import UndoOf, undo_of
from tests.store.model_dags import Dag, shape_of

Row = tuple[str, int]  # (state, attempt)
RowKey = tuple[TaskRole, str]  # (role, task key)
Job = tuple[str, int, TaskRole]  # (task key, attempt, role)

# a finally task not yet run (ready: a retry in its backoff)
FINAL_OPEN_STATES = (TaskState.WAITING, TaskState.READY, TaskState.RUNNING)


# -- the steps --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Act:
    """A step a person takes: a WorkflowRunAction (``action``), or, with ``action`` None,
    the timeout of the gate ``target`` passing."""

    action: RunActionKind | None
    # the gate (Approve, Reject, a timeout) or the compensator (RetryCompensator,
    # SkipCompensator); None for Pause and Resume
    target: str | None = None
    person: str = "alice"
    # applied a second time with the same uid (a replayed object): a no-op
    again: bool = False

    def __str__(self) -> str:
        if self.action is None:
            return f"the timeout of {self.target} passes"
        return f"{self.person}: {self.action.value} {self.target or ''}".rstrip()


@dataclasses.dataclass(frozen=True)
class Judgement:
    """What the model says of an action: accepted or refused, and the refusal's text when a
    rule of the domain refused it (the store's own refusals are not spelled out here)."""

    accepted: bool
    message: str | None = None


# -- the model --------------------------------------------------------------------------------


class RunModel:
    """What the domain says a run is after a sequence of inputs (outcomes, cancels, people's
    actions, gates' timeouts)."""

    def __init__(self, dag: Dag) -> None:
        forward = [task for task in dag.tasks if "compensateFor" not in task]
        # the rows create_run writes: a task whose condition is false, or whose forEach has no
        # items, is skipped at creation and its dependents wait for its own upstreams; a
        # forEach task is its items, each waiting for the task's upstreams, its dependents
        # for every item
        self.shape = shape_of(dag)
        self.graph = self.shape.graph
        self.condition_false = self.shape.condition_false
        self.run_graph = DependencyGraph(self.shape.dependencies)
        self.gates = {
            str(t["key"]): ApprovalSpec.model_validate(t["approval"])
            for t in forward
            if "approval" in t
        }
        self.creator = dag.creator
        self.approved_by: dict[str, list[str]] = {gate: [] for gate in self.gates}
        self.gate_failures: dict[str, GateReason] = {}
        self.compensators = self.shape.compensators  # per forward row (an item's per item)
        self.max_attempts = self.shape.max_attempts
        # the last attempt number each task may reach (a person's RetryCompensator adds)
        self.attempt_limit = dict(self.max_attempts)
        self.started: dict[str, bool] = {}  # whether a task's last attempt started
        self.attempts = dict.fromkeys(self.max_attempts, 1)
        self.succeeded: set[str] = set()
        self.failed: set[str] = set()  # failed for good, and not tolerated
        self.tolerated: set[str] = set()  # forEach items failed within their tolerance
        # when each forward row succeeded or failed for good, in the order of the steps (a
        # forEach compensator undoes the last completed item first)
        self.completed: dict[str, int] = {}
        self._clock = itertools.count()
        self.cancelled: set[str] = set()
        self.cancel_requested = False
        self.phase = RunPhase.RUNNING
        self.triggered = False  # the rollback was decided (compensators pending or skipped)
        self.rollback: tuple[str, ...] = ()  # the compensators it runs, in order
        self.resolved_compensators: dict[str, CompensationState] = {}
        self.running_compensator: str | None = None
        self.compensators_ever_started: set[str] = set()
        self.dispatched = False  # the roots were dispatched (after create_run)
        # the released tasks whose attempt runs; under maxParallelTasks (and a forEach's
        # maxParallel) the rest stay ready, filled in the rows' order as slots free; while
        # paused none starts
        self.limit = dag.limit
        self.active: set[str] = set()
        self.topological = self.shape.rows
        self.paused = False
        self.deferred_cancel = False  # a cancel asked while paused, applied by the resume
        self.recovering = False  # a person recovered the halted rollback: it runs again
        self.recovered = 0  # recovered rollbacks that settled again
        # the finally tasks, in list order; the phase decided before they run (the run takes
        # it once the last has run) and how the rollback ended, as the run row records them
        self.finals = tuple(str(t["key"]) for t in dag.finals)
        self.final_states = dict.fromkeys(self.finals, TaskState.WAITING)
        self.final_phase: RunPhase | None = None
        self.rollback_outcome: RollbackOutcome | None = None
        self.cancel_when_decided = False

    # what every row is

    def released(self) -> frozenset[str]:
        """A tolerated item releases its dependents as a success does."""
        finished = self.failed | self.cancelled
        return frozenset(self.run_graph.ready_tasks(self.succeeded | self.tolerated)) - finished

    def skipped(self) -> frozenset[str]:
        created = self.condition_false | self.shape.no_items
        return self.run_graph.downstream_of(self.failed) | created

    def task_state(self, key: str) -> TaskState:
        if key in self.succeeded:
            return TaskState.SUCCEEDED
        if key in self.failed or key in self.tolerated:
            return TaskState.FAILED
        if key in self.cancelled:
            return TaskState.CANCELLED
        if key in self.skipped():
            return TaskState.SKIPPED
        if key in self.released():
            if key in self.gates:
                return TaskState.AWAITING
            return TaskState.RUNNING if key in self.active else TaskState.READY
        return TaskState.WAITING

    def compensation_state(self, key: str) -> CompensationState:
        if key in self.resolved_compensators:
            return self.resolved_compensators[key]
        if not self.triggered:
            return CompensationState.NOT_TRIGGERED
        assert key in self.rollback, f"{key} was triggered but neither pending nor skipped"
        if key == self.running_compensator:
            return CompensationState.RUNNING
        return CompensationState.PENDING

    def rows(self) -> dict[RowKey, Row]:
        rows: dict[RowKey, Row] = {
            (TaskRole.FORWARD, key): (self.task_state(key), self.attempts[key])
            for key in self.shape.rows
        }
        for key in self.compensators.values():
            rows[(TaskRole.COMPENSATION, key)] = (
                self.compensation_state(key),
                self.attempts[key],
            )
        for key in self.finals:
            rows[(TaskRole.FINALLY, key)] = (self.final_states[key], self.attempts[key])
        return rows

    def running_jobs(self) -> list[Job]:
        jobs: list[Job] = [
            (key, self.attempts[key], TaskRole.FORWARD)
            for key in sorted(self.shape.rows)
            if self.task_state(key) is TaskState.RUNNING
        ]
        if self.running_compensator is not None:
            key = self.running_compensator
            jobs.append((key, self.attempts[key], TaskRole.COMPENSATION))
        jobs.extend(
            (key, self.attempts[key], TaskRole.FINALLY)
            for key in self.finals
            if self.final_states[key] is TaskState.RUNNING
        )
        return jobs

    def awaiting(self) -> list[str]:
        return [gate for gate in sorted(self.gates) if self.task_state(gate) is TaskState.AWAITING]

    def halted_at(self) -> str | None:
        """The compensator a finished run's rollback halted at (None: it did not halt)."""
        failed = [
            key
            for key in sorted(self.compensators.values())
            if self.compensation_state(key) is CompensationState.FAILED
        ]
        return failed[0] if failed and self.phase in TERMINAL_RUN_PHASES else None

    def counts(self) -> TaskCounts:
        """As the store counts them: tolerated items apart from the failed tasks, the tasks
        skipped by their ``when`` among the skipped ones."""
        states = Counter(self.task_state(key) for key in self.shape.rows)
        return TaskCounts(
            total=len(self.shape.rows),
            **{state.value: states[state] for state in TaskState if state is not TaskState.FAILED},
            failed=states[TaskState.FAILED] - len(self.tolerated),
            tolerated=len(self.tolerated),
            condition_false=len(self.condition_false),
        )

    @property
    def compensating(self) -> bool:
        """The run's flag: its rollback was triggered and has not decided the outcome."""
        return self.triggered and self.phase not in TERMINAL_RUN_PHASES and self.final_phase is None

    @property
    def finalizing(self) -> bool:
        """The outcome is decided and its finally tasks run."""
        return self.final_phase is not None and self.phase not in TERMINAL_RUN_PHASES

    @property
    def over(self) -> bool:
        return self.phase in TERMINAL_RUN_PHASES and not self.recovering

    # the inputs

    def dispatch(self) -> None:
        self.dispatched = True
        self.fill()
        self.settle()  # a run whose every task was skipped at creation (when) has finished

    def fill(self) -> None:
        """The released tasks start (never a gate), as many as maxParallelTasks leaves room
        for, first in the rows' order, of a forEach's items no more than its maxParallel at
        once; none while the run is paused or cancelling."""
        if (
            not self.dispatched
            or self.paused
            or self.cancel_requested
            or self.phase in TERMINAL_RUN_PHASES
        ):
            return
        released = self.released() - set(self.gates)
        running = Counter(self.shape.group_of.get(key) for key in self.active)
        for key in self.startable(released - self.active, running):
            if self.limit is not None and len(self.active) >= self.limit:
                break
            self.active.add(key)
            running[self.shape.group_of.get(key)] += 1

    def startable(self, ready: Collection[str], running: Counter[str | None]) -> list[str]:
        """Of the ``ready`` rows, in order, those their forEach's maxParallel lets start
        (``running``: how many of each group's items run)."""
        started: Counter[str | None] = Counter()
        found = []
        for key in self.topological:
            group = self.shape.groups.get(self.shape.group_of.get(key, ""))
            if key not in ready:
                continue
            if group is not None and group.max_parallel is not None:
                if running[group.task] + started[group.task] >= group.max_parallel:
                    continue
                started[group.task] += 1
            found.append(key)
        return found

    def attempted(self) -> frozenset[str]:
        """The failed tasks (tolerated items too) the rollback undoes as attempted
        (``undo.undo_of``)."""
        return frozenset(
            key
            for key in self.failed | self.tolerated
            if key in self.compensators
            and undo_of(
                forward_state=TaskState.FAILED,
                started=self.started.get(key, False),
                compensate_on=self.shape.compensate_on[key],
            )
            is UndoOf.ATTEMPTED
        )

    def rollback_order(
        self, *, succeeded: Collection[str] | None = None, attempted: Collection[str] | None = None
    ) -> tuple[str, ...]:
        """The compensators the rollback runs (of the model's rows, or of ``succeeded`` and
        ``attempted``): those undoing attempted rows first, then those of the succeeded ones,
        each part a dependent's before its dependency's (``graph.compensation_order`` of their
        tasks), and a forEach compensator's items the one completed last first."""

        def part(rows: Collection[str]) -> list[str]:
            rows = [row for row in rows if row in self.compensators]
            tasks = {self.shape.task_of(row) for row in rows}
            order: list[str] = []
            for compensator in self.graph.compensation_order(tasks, self.shape.task_compensators):
                undone = [
                    row
                    for row in rows
                    if self.shape.task_compensators[self.shape.task_of(row)] == compensator
                ]
                undone.sort(key=lambda row: (-self.completed[row], self.compensators[row]))
                order.extend(self.compensators[row] for row in undone)
            return order

        succeeded = self.succeeded if succeeded is None else succeeded
        attempted = self.attempted() if attempted is None else attempted
        return (*part(attempted), *part(succeeded))

    def outcome(self, job: Job, *, succeeded: bool, started: bool = True) -> None:
        key, attempt, role = job
        assert job in self.running_jobs(), f"the model has no running attempt {job}"
        self.started[key] = started
        retry = not succeeded and attempt < self.attempt_limit[key]
        if retry:
            self.attempts[key] += 1
        if role is TaskRole.FORWARD:
            self.active.discard(key)
            if not retry:
                self.completed[key] = next(self._clock)
                if succeeded:
                    self.succeeded.add(key)
                else:
                    self.forward_failed(key)
        elif role is TaskRole.FINALLY:  # a failed one does not stop the next
            self.final_states[key] = (
                TaskState.SUCCEEDED if succeeded else TaskState.READY if retry else TaskState.FAILED
            )
        else:
            self.running_compensator = None
            if succeeded:
                self.resolved_compensators[key] = CompensationState.SUCCEEDED
            elif not retry:  # a compensator that fails for good halts the rollback
                self.resolved_compensators[key] = CompensationState.FAILED
                for rest in self.rollback:
                    self.resolved_compensators.setdefault(rest, CompensationState.SKIPPED)
        self.settle()
        self.fill()

    def forward_failed(self, key: str) -> None:
        """A forward row failed for good. A forEach item within its task's tolerance is
        tolerated; past it, the task's other unresolved items are cancelled."""
        group = self.shape.groups.get(self.shape.group_of.get(key, ""))
        if group is None:
            self.failed.add(key)
            return
        failed = sum(member in self.failed | self.tolerated for member in group.members) + 1
        if failed <= group.tolerance:
            self.tolerated.add(key)
            return
        self.failed.add(key)
        for member in group.members:
            if self.task_state(member) in UNRESOLVED_TASK_STATES:
                self.cancelled.add(member)
                self.active.discard(member)

    def cancel(self, *, rollback: bool) -> bool:
        """Whether the cancel is recorded (kept for the resume, while paused)."""
        if self.phase in TERMINAL_RUN_PHASES:
            return False
        if rollback and self.paused and not self.cancel_requested:
            recorded = not self.deferred_cancel
            self.deferred_cancel = True
            return recorded
        recorded = False
        if not self.cancel_requested:
            self.request_cancel()
            recorded = True
        if not rollback:  # the object is gone: no compensator nor finally task can run
            self.running_compensator = None
            for key in self.compensators.values():
                if self.compensation_state(key) not in TERMINAL_COMPENSATION_STATES:
                    self.resolved_compensators[key] = CompensationState.SKIPPED
                    recorded = True
            for key in self.finals:
                if self.final_states[key] in FINAL_OPEN_STATES:
                    self.final_states[key] = TaskState.SKIPPED
                    recorded = True
        if recorded:
            self.settle()
        return recorded

    def request_cancel(self) -> None:
        unresolved = {
            key for key in self.shape.rows if self.task_state(key) in UNRESOLVED_TASK_STATES
        }
        self.cancel_requested = True
        self.cancelled |= unresolved
        self.active.clear()

    def time_out(self, gate: str) -> None:
        assert gate in self.awaiting(), f"{gate} does not await"
        self.failed.add(gate)
        self.gate_failures[gate] = GateReason.TIMED_OUT
        self.settle()
        self.fill()

    def act(self, act: Act) -> Judgement:
        """Judge a person's action and, accepted, apply it (the run settles after it)."""
        assert act.action is not None
        if act.action in (RunActionKind.APPROVE, RunActionKind.REJECT):
            judgement = self.decide_gate(act)
        elif act.action in (RunActionKind.PAUSE, RunActionKind.RESUME):
            judgement = self.pause_or_resume(act.action)
        else:
            judgement = self.recover(act)
        if judgement.accepted:
            self.settle()
            self.fill()
        return judgement

    def decide_gate(self, act: Act) -> Judgement:
        gate, actor = str(act.target), Actor(username=act.person)
        if (
            gate not in self.gates
            or self.phase is not RunPhase.RUNNING
            or self.compensating
            or self.cancel_requested
            or self.task_state(gate) is not TaskState.AWAITING
        ):
            return Judgement(accepted=False)
        approval = self.gates[gate]
        if act.action is RunActionKind.REJECT:
            refusal = rejection_refusal(gate=gate, approval=approval, actor=actor)
            if refusal is None:
                self.failed.add(gate)
                self.gate_failures[gate] = GateReason.REJECTED
            return Judgement(accepted=refusal is None, message=refusal)
        refusal = approval_refusal(
            gate=gate,
            approval=approval,
            actor=actor,
            creator=self.creator,
            approved_by=self.approved_by[gate],
        )
        if refusal is None:
            self.approved_by[gate].append(act.person)
            if len(self.approved_by[gate]) >= approval.required:
                self.succeeded.add(gate)
        return Judgement(accepted=refusal is None, message=refusal)

    def pause_or_resume(self, action: RunActionKind) -> Judgement:
        refusal = pause_refusal(action=action, phase=self.phase, paused=self.paused)
        if refusal is not None:
            return Judgement(accepted=False, message=refusal)
        self.paused = action is RunActionKind.PAUSE
        if not self.paused and self.deferred_cancel:
            self.request_cancel()
        self.deferred_cancel = False
        return Judgement(accepted=True)

    def recover(self, act: Act) -> Judgement:
        compensator = str(act.target)
        refusal = recovery_refusal(
            phase=self.phase,
            compensating=self.compensating or self.recovering,
            compensator=compensator,
            states={key: self.compensation_state(key) for key in self.compensators.values()},
        )
        if refusal is not None:
            return Judgement(accepted=False, message=refusal)
        if act.action is RunActionKind.RETRY_COMPENSATOR:  # fresh attempts
            self.attempt_limit[compensator] = (
                self.attempts[compensator] + self.max_attempts[compensator]
            )
            self.attempts[compensator] += 1
            del self.resolved_compensators[compensator]
        else:
            self.resolved_compensators[compensator] = CompensationState.SKIPPED
        for key in self.rollback:  # the ones the halt skipped are pending again
            if (
                self.resolved_compensators.get(key) is CompensationState.SKIPPED
                and key not in self.compensators_ever_started
            ):
                del self.resolved_compensators[key]
        self.recovering = True
        return Judgement(accepted=True)

    def settle(self) -> None:
        if self.phase in TERMINAL_RUN_PHASES:
            if self.recovering:
                self.next_compensator(self.phase)
            return
        if self.final_phase is not None:
            self.next_final()
            return
        phase = settled_phase(counts=self.counts(), cancel_requested=self.cancel_requested)
        if phase is RunPhase.RUNNING:
            return
        if not self.triggered:
            if phase is RunPhase.SUCCEEDED or not (self.succeeded or self.attempted()):
                self.decide(phase)  # nothing to roll back: compensators stay not triggered
                return
            self.triggered = True
            order = self.rollback_order()
            self.rollback = tuple(k for k in order if k not in self.resolved_compensators)
            for key in self.compensators.values():
                if key not in self.rollback:
                    self.resolved_compensators.setdefault(key, CompensationState.SKIPPED)
        self.next_compensator(phase)

    def next_compensator(self, phase: RunPhase) -> None:
        """Start the first pending compensator of the rollback (not while a person paused the
        run; a finished run's recovered rollback ignores that); with none left, finish the
        run, or end its recovery."""
        if self.running_compensator is not None:
            return
        pending = [key for key in self.rollback if key not in self.resolved_compensators]
        ended = self.phase in TERMINAL_RUN_PHASES
        if pending:
            if ended or not self.paused:
                self.running_compensator = pending[0]
                self.compensators_ever_started.add(pending[0])
        elif ended:
            self.recovering = False
            self.recovered += 1
        else:
            self.decide(phase)

    def decide(self, phase: RunPhase) -> None:
        """The outcome is decided: the run takes ``phase``, or first runs its finally tasks
        (unless the object went and they were skipped)."""
        if not any(state is TaskState.WAITING for state in self.final_states.values()):
            self.phase = phase
            return
        self.final_phase = phase
        self.cancel_when_decided = self.cancel_requested
        halted = CompensationState.FAILED in self.resolved_compensators.values()
        self.rollback_outcome = (
            RollbackOutcome.NONE
            if not self.rollback
            else RollbackOutcome.HALTED
            if halted
            else RollbackOutcome.COMPLETED
        )
        self.next_final()

    def next_final(self) -> None:
        """Start the finally task whose turn it is (one at a time, in list order, none while
        paused); with none left, the run takes the decided phase."""
        assert self.final_phase is not None
        open_ = [key for key in self.finals if self.final_states[key] in FINAL_OPEN_STATES]
        if not open_:
            self.phase = self.final_phase
        elif self.final_states[open_[0]] is not TaskState.RUNNING and not self.paused:
            self.final_states[open_[0]] = TaskState.RUNNING
