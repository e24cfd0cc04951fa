"""The pure model of a run that ``test_run_model.py`` holds the store to: the drawn
definitions (``Dag``, ``dags``), the steps people take (``Act``) and what the domain says
every row and flag of the run is after a sequence of inputs (``RunModel``). Nothing here
touches the store; ``model_checker.py`` drives the store and compares."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

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
    CompensationState,
    RunPhase,
    TaskRole,
    TaskState,
)
from flowforge.domain.undo import CompensateOn, UndoOf, rollback_order, undo_of

Row = tuple[str, int]  # (state, attempt)
RowKey = tuple[TaskRole, str]  # (role, task key)
Job = tuple[str, int, TaskRole]  # (task key, attempt, role)

# the people who create runs and act on them; a gate lists some of them as approvers
PEOPLE = ("alice", "bob", "carol", "dave")
# a gate's timeout is never reached by the clock: a step moves its deadline back instead
GATE_TIMEOUT_SECONDS = 3600
# a finally task not yet run (ready: a retry in its backoff)
FINAL_OPEN_STATES = (TaskState.WAITING, TaskState.READY, TaskState.RUNNING)


# -- the runs ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Dag:
    """A drawn definition: its tasks as the document lists them."""

    tasks: tuple[Mapping[str, Any], ...]
    # the run's maxParallelTasks (None: unlimited)
    limit: int | None = None
    # boolean parameter declarations: a task with ``when: params.pN`` runs when pN's default is
    # true and is skipped (ConditionFalse) at creation when it is false
    parameters: tuple[Mapping[str, Any], ...] = ()
    # who created the run (an approval gate's forbidSelf)
    creator: str | None = None
    # spec.finally, in list order
    finals: tuple[Mapping[str, Any], ...] = ()

    def __repr__(self) -> str:
        parts = []
        for task in self.tasks:
            text = f"{task['key']}(retries={task.get('retries', 0)}"
            if "approval" in task:
                text = f"{task['key']}(gate {dict(task['approval'])}"
            if task.get("dependsOn"):
                text += f", after {'+'.join(task['dependsOn'])}"
            if task.get("compensateFor"):
                text += f", undoes {task['compensateFor']}"
            if task.get("when"):
                text += f", when {task['when']}"
            if task.get("compensateOn"):
                text += f" on {task['compensateOn']}"
            parts.append(text + ")")
        limit = f", maxParallelTasks={self.limit}" if self.limit else ""
        values = ", ".join(f"{p['name']}={p['default']}" for p in self.parameters)
        creator = f"; created by {self.creator}" if self.creator else ""
        finals = ", ".join(f"{t['key']}(retries={t['retries']})" for t in self.finals)
        return (
            "Dag["
            + "; ".join(parts)
            + limit
            + (f"; {values}" if values else "")
            + creator
            + (f"; finally {finals}" if finals else "")
            + "]"
        )


@st.composite
def approvals(draw: st.DrawFn) -> dict[str, Any]:
    """A gate's ``approval``: listed users (or anyone), 1-2 of them required, maybe forbidding
    the creator, maybe a timeout."""
    approval: dict[str, Any] = {}
    most = len(PEOPLE)
    if draw(st.integers(0, 3), label="lists approvers") > 0:
        users = draw(st.lists(st.sampled_from(PEOPLE), min_size=1, max_size=3, unique=True))
        approval["approvers"] = {"users": users}
        most = len(users)
    approval["required"] = draw(st.integers(1, min(2, most)), label="required")
    if draw(st.booleans(), label="forbidSelf"):
        approval["forbidSelf"] = True
    if draw(st.booleans(), label="has a timeout"):
        approval["timeoutSeconds"] = GATE_TIMEOUT_SECONDS
    return approval


@st.composite
def dags(draw: st.DrawFn) -> Dag:
    """2-8 forward tasks, each depending on some earlier ones, some of them approval gates
    (no type, no retries, no compensator); keys and declaration order are shuffled so that
    neither follows the topological order (ties are broken by key); a third of the runs have
    1-2 ``finally`` tasks (retries 0-1)."""
    size = draw(st.integers(min_value=2, max_value=8), label="forward tasks")
    names = draw(st.permutations([f"t{n}" for n in range(size)]), label="keys")
    retries = st.integers(min_value=0, max_value=2)
    tasks: list[dict[str, Any]] = []
    parameters: list[dict[str, Any]] = []
    guarded = st.integers(0, 3).map(lambda n: n == 3)
    gated = st.integers(0, 3).map(lambda n: n == 3)
    for index, key in enumerate(names):
        upstream = draw(st.sets(st.sampled_from(names[:index])) if index else st.just(set()))
        gate = draw(gated, label=f"{key} is a gate")
        task: dict[str, Any] = (
            {"key": key, "approval": draw(approvals())}
            if gate
            else {"key": key, "retries": draw(retries)}
        )
        if upstream:
            task["dependsOn"] = sorted(upstream)
        if draw(guarded, label=f"{key} has a when"):
            value = draw(st.booleans(), label=f"{key}'s condition")
            parameters.append({"name": f"p{index}", "type": "boolean", "default": value})
            task["when"] = f"params.p{index}"
        tasks.append(task)
        if not gate and draw(st.booleans()):
            compensator = {"key": f"undo-{key}", "compensateFor": key, "retries": draw(retries)}
            if draw(st.booleans(), label="compensateOn: Attempted"):
                compensator["compensateOn"] = CompensateOn.ATTEMPTED.value
            tasks.append(compensator)
    order = draw(st.permutations(range(len(tasks))), label="declaration order")
    limit = draw(st.none() | st.integers(min_value=1, max_value=3), label="maxParallelTasks")
    finals = draw(st.integers(0, 5).map(lambda n: max(0, n - 3)), label="finally tasks")
    return Dag(
        tasks=tuple(tasks[position] for position in order),
        limit=limit,
        parameters=tuple(parameters),
        creator=draw(st.sampled_from((None, *PEOPLE)), label="created by"),
        finals=tuple(
            {"key": f"f{n}", "retries": draw(st.integers(0, 1), label=f"f{n}'s retries")}
            for n in range(finals)
        ),
    )


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


def _contracted(
    dependencies: Mapping[str, Sequence[str]], skipped: frozenset[str]
) -> dict[str, set[str]]:
    """The dependencies of the tasks that run, each skipped task replaced by its own
    upstreams, transitively (written here from the rule, not from expand())."""

    def through(key: str) -> set[str]:
        found: set[str] = set()
        for upstream in dependencies[key]:
            found |= through(upstream) if upstream in skipped else {upstream}
        return found

    return {key: through(key) for key in dependencies if key not in skipped}


class RunModel:
    """What the domain says a run is after a sequence of inputs (outcomes, cancels, people's
    actions, gates' timeouts)."""

    def __init__(self, dag: Dag) -> None:
        forward = [task for task in dag.tasks if "compensateFor" not in task]
        self.graph = DependencyGraph({t["key"]: t.get("dependsOn", ()) for t in forward})
        # a task whose condition is false is skipped at creation; the others wait for the
        # tasks that run, a skipped task's upstreams standing in for it (domain/expansion.py)
        values = {p["name"]: p["default"] for p in dag.parameters}
        self.condition_false = frozenset(
            str(t["key"]) for t in forward if "when" in t and not values[t["when"][7:]]
        )
        self.run_graph = DependencyGraph(
            _contracted({t["key"]: t.get("dependsOn", ()) for t in forward}, self.condition_false)
        )
        self.gates = {
            str(t["key"]): ApprovalSpec.model_validate(t["approval"])
            for t in forward
            if "approval" in t
        }
        self.creator = dag.creator
        self.approved_by: dict[str, list[str]] = {gate: [] for gate in self.gates}
        self.gate_failures: dict[str, GateReason] = {}
        self.compensators: dict[str, str] = {
            t["compensateFor"]: t["key"] for t in dag.tasks if "compensateFor" in t
        }
        self.compensate_on = {
            str(t["compensateFor"]): CompensateOn(t.get("compensateOn", "Succeeded"))
            for t in dag.tasks
            if "compensateFor" in t
        }
        self.max_attempts = {
            str(t["key"]): int(t.get("retries", 0)) + 1 for t in (*dag.tasks, *dag.finals)
        }
        # the last attempt number each task may reach (a person's RetryCompensator adds)
        self.attempt_limit = dict(self.max_attempts)
        self.started: dict[str, bool] = {}  # whether a task's last attempt started
        self.attempts = dict.fromkeys(self.max_attempts, 1)
        self.succeeded: set[str] = set()
        self.failed: set[str] = set()
        self.cancelled: set[str] = set()
        self.cancel_requested = False
        self.phase = RunPhase.RUNNING
        self.triggered = False  # the rollback was decided (compensators pending or skipped)
        self.rollback: tuple[str, ...] = ()  # the compensators it runs, in order
        self.resolved_compensators: dict[str, CompensationState] = {}
        self.running_compensator: str | None = None
        self.compensators_ever_started: set[str] = set()
        self.dispatched = False  # the roots were dispatched (after create_run)
        # the released tasks whose attempt runs; under maxParallelTasks the rest stay ready,
        # filled in topological order (ties by key) as slots free; while paused none starts
        self.limit = dag.limit
        self.active: set[str] = set()
        self.topological = self.graph.topological_order()
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
        finished = self.failed | self.cancelled
        return frozenset(self.run_graph.ready_tasks(self.succeeded)) - finished

    def skipped(self) -> frozenset[str]:
        return self.run_graph.downstream_of(self.failed) | self.condition_false

    def task_state(self, key: str) -> TaskState:
        if key in self.succeeded:
            return TaskState.SUCCEEDED
        if key in self.failed:
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
            for key in self.graph.keys
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
            for key in sorted(self.graph.keys)
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
        states = [self.task_state(key) for key in self.graph.keys]
        return TaskCounts(total=len(states), **{s.value: states.count(s) for s in TaskState})

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
        for, first in topological order; none while the run is paused or cancelling."""
        if (
            not self.dispatched
            or self.paused
            or self.cancel_requested
            or self.phase in TERMINAL_RUN_PHASES
        ):
            return
        released = self.released() - set(self.gates)
        waiting = [key for key in self.topological if key in released and key not in self.active]
        room = len(waiting) if self.limit is None else max(0, self.limit - len(self.active))
        self.active |= set(waiting[:room])

    def attempted(self) -> frozenset[str]:
        """The failed tasks the rollback undoes as attempted (``undo.undo_of``)."""
        return frozenset(
            key
            for key in self.failed
            if key in self.compensators
            and undo_of(
                forward_state=TaskState.FAILED,
                started=self.started.get(key, False),
                compensate_on=self.compensate_on[key],
            )
            is UndoOf.ATTEMPTED
        )

    def rollback_order(self) -> tuple[str, ...]:
        return rollback_order(
            self.graph,
            succeeded=self.succeeded,
            attempted=self.attempted(),
            compensators=self.compensators,
        )

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
                (self.succeeded if succeeded else self.failed).add(key)
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
            key
            for key in self.graph.keys
            if self.task_state(key)
            in (TaskState.WAITING, TaskState.READY, TaskState.AWAITING, TaskState.RUNNING)
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
