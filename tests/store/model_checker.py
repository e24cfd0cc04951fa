"""Drives one example's run through the real store (``Checker``) and compares every step with
the pure model of ``model_runs.py``, the spec's statements and the state tables (see
``test_run_model.py``)."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import event, note

from flowforge.domain.decision import Decision, JobRef
from flowforge.domain.execution import AttemptOutcome, BackoffPolicy, OutcomeReason
from flowforge.domain.for_each import PARTIAL_FAILURE
from flowforge.domain.history import EventKind
from flowforge.domain.projection import settled_phase
from flowforge.domain.run_actions import (
    GATE_ACTIONS,
    RECOVERY_ACTIONS,
    RECOVERY_TRANSITIONS,
    Actor,
    RunAction,
    RunActionKind,
)
from flowforge.domain.states import (
    COMPENSATION_TRANSITIONS,
    RUN_TRANSITIONS,
    TASK_TRANSITIONS,
    TERMINAL_RUN_PHASES,
    UNRESOLVED_COMPENSATION_STATES,
    UNRESOLVED_TASK_STATES,
    CompensationState,
    RunPhase,
    TaskRole,
    TaskState,
)
from flowforge.store.actions import ActionOutcome, apply_action
from flowforge.store.cancel import cancel_run
from flowforge.store.connection import Pool
from flowforge.store.dispatch import JobCreated, dispatch_due, record_jobs_created
from flowforge.store.events import run_history
from flowforge.store.lease import Fence
from flowforge.store.moves import settle_run
from flowforge.store.outcomes import record_outcome
from flowforge.store.queries import forward_counts, list_tasks, rollback_steps
from flowforge.store.runs import get_run
from tests.store.conftest import start_run
from tests.store.model_dags import Dag, Group
from tests.store.model_runs import Act, Job, Row, RowKey, RunModel

BACKOFF = BackoffPolicy(first_delay_seconds=0.0, jitter=0.0)
SUCCESS = AttemptOutcome(succeeded=True, reason=OutcomeReason.COMPLETED, exit_code=0)
FAILURE = AttemptOutcome(
    succeeded=False, reason=OutcomeReason.EXIT_CODE, message="exit code 1", exit_code=1
)
# a failure whose Pod never started its container (compensateOn: Attempted undoes nothing)
NOT_STARTED = AttemptOutcome(
    succeeded=False, reason=OutcomeReason.IMAGE_PULL_BACK_OFF, message="image not pulled"
)
OUTCOMES = {"success": SUCCESS, "failure": FAILURE, "not started": NOT_STARTED}
_workflow_numbers = itertools.count(1)
_ACTION_KINDS = (EventKind.ACTION_ACCEPTED, EventKind.ACTION_REFUSED)

# the moves of a finally task's row (its own, smaller table than a forward task's)
FINAL_TRANSITIONS: Mapping[TaskState, frozenset[TaskState]] = {
    TaskState.WAITING: frozenset({TaskState.RUNNING, TaskState.SKIPPED}),
    TaskState.RUNNING: frozenset(
        {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.READY, TaskState.SKIPPED}
    ),
    TaskState.READY: frozenset({TaskState.RUNNING, TaskState.SKIPPED}),
    TaskState.SUCCEEDED: frozenset(),
    TaskState.FAILED: frozenset(),
    TaskState.SKIPPED: frozenset(),
}
_TABLES: Mapping[TaskRole, Mapping[Any, frozenset[Any]]] = {
    TaskRole.FORWARD: TASK_TRANSITIONS,
    TaskRole.COMPENSATION: COMPENSATION_TRANSITIONS,
    TaskRole.FINALLY: FINAL_TRANSITIONS,
}

# the moves that start another attempt: the attempt number grows by one on them, only
RETRY_MOVES: frozenset[tuple[str, str]] = frozenset(
    {
        (TaskState.RUNNING, TaskState.READY),
        (CompensationState.RUNNING, CompensationState.PENDING),
        # a person's RetryCompensator: fresh attempts
        (CompensationState.FAILED, CompensationState.PENDING),
    }
)


async def _snapshot(pool: Pool, run_id: int) -> dict[RowKey, Row]:
    return {(t.role, t.task_key): (t.state, t.attempt) for t in await list_tasks(pool, run_id)}


def _show(rows: Mapping[RowKey, Row]) -> str:
    return ", ".join(
        f"{key}={state}#{attempt}" for (_, key), (state, attempt) in sorted(rows.items())
    )


def move_allowed(role: TaskRole, before: Row, after: Row, *, person: bool = False) -> bool:
    """``before -> after`` is one table move, or two in one transaction, and the attempt grew
    by exactly the number of retry moves on the way. ``person``: a person's recovery of a
    compensator, whose first move is one of ``RECOVERY_TRANSITIONS``."""
    table = _TABLES[role]
    first_table: Mapping[Any, frozenset[Any]] = (
        RECOVERY_TRANSITIONS if person and role is TaskRole.COMPENSATION else table
    )
    (state, attempt), (target, target_attempt) = before, after
    grown = target_attempt - attempt
    for first in first_table.get(state, frozenset()):
        retries = int((state, first) in RETRY_MOVES)
        if first == target and grown == retries:
            return True
        for second in table[first]:
            if second == target and grown == retries + int((first, second) in RETRY_MOVES):
                return True
    return False


class Checker:
    """One example's run: drives the store and compares every step."""

    def __init__(self, pool: Pool, fence: Fence, dag: Dag) -> None:
        self.pool, self.fence, self.dag = pool, fence, dag
        self.model = RunModel(dag)
        self.rows: dict[RowKey, Row] = {}
        self.phase = RunPhase.RUNNING
        self.run_id = 0
        self.run_uid = ""
        self.run_name = ""
        self.ever_started: set[str] = set()
        self.compensators_started: list[str] = []
        self.finals_started: list[str] = []
        # attempts that ended: their outcomes may arrive again; and a Job forged for each
        # gate's attempt, whose outcome must never move it
        self.stale: list[Job] = [(gate, 1, TaskRole.FORWARD) for gate in sorted(self.model.gates)]
        self.actions: list[tuple[str, str]] = []  # (uid, the history's kind) per action
        self.log: list[str] = []

    def fail(self, message: str) -> None:
        raise AssertionError(
            f"{message}\n  run: {self.dag!r}\n  steps:\n    " + "\n    ".join(self.log)
        )

    def expect(self, condition: bool, message: str) -> None:
        if not condition:
            self.fail(message)

    async def create(self) -> None:
        workflow = f"model-{next(_workflow_numbers)}"
        started = await start_run(
            self.pool,
            self.fence,
            self.dag.tasks,
            workflow=workflow,
            max_parallel_tasks=self.dag.limit,
            parameters=self.dag.parameters,
            requested_by=self.dag.creator,
            final_tasks=self.dag.finals,
        )
        self.run_id, self.run_uid, self.run_name = started.run.id, started.run.uid, started.run.name
        self.log.append(f"create_run {workflow} (run #{self.run_id})")
        observed = await _snapshot(self.pool, self.run_id)
        for (role, key), (state, attempt) in observed.items():
            skipped = self.model.condition_false | self.model.shape.no_items
            initial = (
                ({TaskState.SKIPPED} if key in skipped else set())
                | ({TaskState.AWAITING} if key in self.model.gates else {TaskState.READY})
                | {TaskState.WAITING}
                if role is TaskRole.FORWARD
                else {TaskState.WAITING}
                if role is TaskRole.FINALLY
                else {CompensationState.NOT_TRIGGERED}
            )
            self.expect(state in initial and attempt == 1, f"created {key} as {state}#{attempt}")
        await self.compare(observed, Decision(recorded=True))
        decision = await dispatch_due(self.pool, fence=self.fence, run_id=self.run_id)
        model = self.model
        model.dispatch()
        # recorded when a task started, a gate's timeout was set for the wake-up, or the
        # run finished
        timed = [gate for gate in model.awaiting() if model.gates[gate].timeout_seconds]
        recorded = bool(model.running_jobs() or timed or model.phase in TERMINAL_RUN_PHASES)
        await self.step("dispatch_due", decision, recorded=recorded)

    async def outcome(self, job: Job, *, succeeded: bool, replay: bool = False) -> None:
        await self.outcomes([(job, "success" if succeeded else "failure")], replay=replay)

    async def outcomes(self, ended: Sequence[tuple[Job, str]], *, replay: bool = False) -> None:
        """Record how attempts ended; two of them at once (concurrently) race each other. An
        item failing past its task's tolerance stops the Jobs of the task's running items."""
        model = self.model
        jobs = [job for job, _ in ended]
        running = [] if replay else [j for j in model.running_jobs() if j[2] is TaskRole.FORWARD]
        decisions = await asyncio.gather(
            *(
                record_outcome(
                    self.pool,
                    fence=self.fence,
                    run_id=self.run_id,
                    run_uid=self.run_uid,
                    job=JobRef(task_key=key, attempt=attempt, role=role),
                    outcome=OUTCOMES[how],
                    backoff=BACKOFF,
                )
                for (key, attempt, role), how in ended
            )
        )
        self.expect(
            all(d.recorded is not replay for d in decisions),
            f"recorded {[d.recorded for d in decisions]} (replayed: {replay})",
        )
        decision = decisions[0]
        for later in decisions[1:]:
            decision = decision.then(later)
        labels = []
        for job, how in ended:
            if not replay:
                model.outcome(job, succeeded=how == "success", started=how != "not started")
                self.stale.append(job)
            key, attempt, role = job
            labels.append(f"{'replayed ' if replay else ''}{how} of {role} {key}#{attempt}")
        if len(ended) > 1 and model.limit is not None:
            await self.adopt_slots()
        groups = {model.shape.group_of.get(key) for key, _, _ in jobs}
        if len(ended) > 1 and len(groups) == 1 and None not in groups:
            await self.adopt_completion([key for key, _, _ in jobs])
        label = " together with ".join(labels)
        await self.step(label, decision, recorded=not replay)
        ended_rows = [] if replay else [key for key, _, role in jobs if role == "forward"]
        self.check_item_notices(label, decision, ended_rows)
        cancelled = [
            job
            for job in running
            if job not in jobs and model.task_state(job[0]) is TaskState.CANCELLED
        ]
        await self.stopped(decision, cancelled)

    def check_item_notices(self, label: str, decision: Decision, ended: Sequence[str]) -> None:
        """An item failing within its task's tolerance is told (PartialFailure), one past it
        too (ItemsStopped); no other outcome tells either."""
        model = self.model
        reasons = {notice.reason for notice in decision.notices}
        tolerated = any(key in model.tolerated for key in ended)
        past = any(key in model.failed and key in model.shape.group_of for key in ended)
        self.expect(
            (PARTIAL_FAILURE in reasons, "ItemsStopped" in reasons) == (tolerated, past),
            f"{label}: notices {sorted(reasons)}, an item tolerated {tolerated}, past {past}",
        )
        if tolerated:
            event("a forEach item failed within its tolerance")
        if past:
            event("a forEach item failed past its tolerance")

    async def adopt_slots(self) -> None:
        """Two outcomes at once hand their slots on in either order: which released tasks
        got them may differ from one fill of the end state, but every slot is taken by a
        released task; the model then goes on from what the store chose."""
        model = self.model
        observed = await _snapshot(self.pool, self.run_id)
        running = {
            key
            for (role, key), (state, _) in observed.items()
            if role == TaskRole.FORWARD and state == TaskState.RUNNING
        }
        released = model.released() - set(model.gates)
        self.expect(running <= released, f"running {sorted(running)} not all released")
        if not (model.cancel_requested or model.paused or model.phase in TERMINAL_RUN_PHASES):
            assert model.limit is not None
            startable = model.startable(released, Counter())
            full = min(model.limit, len(startable))
            self.expect(len(running) == full, f"{len(running)} running, {full} slots taken")
        model.active = running
        event("two outcomes handed slots on together")

    async def adopt_completion(self, keys: Sequence[str]) -> None:
        """Two items of one forEach ended at once: which completed first (the undo order of
        its compensator) is the store's to say; the model goes on from it."""
        model = self.model
        done = [key for key in keys if key in model.completed]
        if len(done) < 2:
            return
        async with self.pool.connection() as connection:
            cursor = await connection.execute(
                "SELECT task_key, finished_at FROM flowforge_task WHERE run_id = %s "
                "AND role = 'forward' AND task_key = ANY(%s)",
                (self.run_id, done),
            )
            finished = {str(key): at for key, at in await cursor.fetchall()}
        first, second = sorted(done, key=lambda key: model.completed[key])
        if finished[first] > finished[second]:
            model.completed[first], model.completed[second] = (
                model.completed[second],
                model.completed[first],
            )
        elif finished[first] == finished[second]:
            model.completed[second] = model.completed[first]
        event("two items of a forEach ended together")

    async def cancel(self, *, rollback: bool) -> None:
        model = self.model
        first = not model.cancel_requested and not model.deferred_cancel
        # a paused run keeps the cancel for its resume (unless its object is gone)
        deferring = rollback and model.paused and not model.cancel_requested
        if first and model.compensating:
            event("cancelled while compensating")
        if first and deferring and model.phase not in TERMINAL_RUN_PHASES:
            event("a cancel kept for the resume")
        applied = not model.cancel_requested and not deferring
        if model.finalizing:
            event(f"cancelled while finalizing (rollback={rollback})")
        # the Jobs to stop: the forward attempts that were running (a compensator's Job is
        # left to finish, or is gone with the object when the rollback is dropped), and a
        # running finally task's when the object is gone
        running: list[Job] = [
            job
            for job in model.running_jobs()
            if (job[2] is TaskRole.FORWARD and applied)
            or (job[2] is TaskRole.FINALLY and not rollback)
        ]
        decision = await cancel_run(
            self.pool, fence=self.fence, run_id=self.run_id, reason="model", rollback=rollback
        )
        recorded = model.cancel(rollback=rollback)
        await self.step(f"cancel_run(rollback={rollback})", decision, recorded=recorded)
        await self.stopped(decision, running)

    async def stopped(self, decision: Decision, running: list[Job]) -> None:
        """The decision stops exactly the Jobs of ``running``; they are stale from now."""
        stopped = sorted((job.task_key, job.attempt, job.role) for job in decision.stop_jobs)
        expected = sorted(running)
        self.expect(stopped == expected, f"stopped {stopped}, expected {expected}")
        self.stale.extend(running)
        # a forward Job whose creation raced the cancel: delete it (a finally task's goes
        # with the object)
        for key, attempt, role in stopped:
            if role is not TaskRole.FORWARD:
                continue
            late = await self.job_created(key, attempt)
            self.expect(late, f"the Job of {key}#{attempt}, created after the cancel, is kept")

    async def act(self, act: Act) -> None:
        """A person's step: a gate's timeout passing, or a WorkflowRunAction applied (and
        maybe applied again, which changes nothing)."""
        model = self.model
        if act.action is None:
            await self.time_out(str(act.target))
            return
        action = RunAction(
            run=self.run_name,
            action=act.action,
            task=act.target if act.action in GATE_ACTIONS else None,
            compensator=act.target if act.action in RECOVERY_ACTIONS else None,
            reason="the model says so",
        )
        uid = f"act-{self.run_id}-{len(self.actions)}"
        deferred = model.deferred_cancel
        running: list[Job] = [job for job in model.running_jobs() if job[2] is TaskRole.FORWARD]
        done = await self.apply(uid, action, act.person)
        judged = model.act(act)
        verdict = "Accepted" if judged.accepted else "Refused"
        event(f"{act.action.value} {verdict}")
        kind = EventKind.ACTION_ACCEPTED if done.accepted else EventKind.ACTION_REFUSED
        self.actions.append((uid, kind))
        label = f"{act} -> {done.result.value}: {done.message}"
        self.expect(
            done.accepted == judged.accepted and not done.already, f"{label}, the model {verdict}"
        )
        self.expect(
            judged.message is None or done.message == judged.message,
            f"{label}, the domain says {judged.message!r}",
        )
        if not judged.accepted:
            self.expect(
                not done.decision.create_jobs and not done.decision.stop_jobs,
                f"{label}: a refused action moved {done.decision}",
            )
        person = judged.accepted and act.action in RECOVERY_ACTIONS
        await self.step(label, done.decision, recorded=True, person=person)
        resumed = act.action is RunActionKind.RESUME and judged.accepted and deferred
        await self.stopped(done.decision, running if resumed else [])
        if act.again:
            again = await self.apply(uid, action, act.person)
            self.expect(
                again.already and (again.result, again.message) == (done.result, done.message),
                f"{label} applied again: {again}",
            )
            await self.step(f"{act} again", again.decision, recorded=False)

    async def apply(self, uid: str, action: RunAction, person: str) -> ActionOutcome:
        return await apply_action(
            self.pool,
            fence=self.fence,
            run_id=self.run_id,
            uid=uid,
            name=uid,
            action=action,
            actor=Actor(username=person),
        )

    async def time_out(self, gate: str) -> None:
        """The gate's deadline passes (moved back, as the clock would) and the run settles,
        as the wake-up at the deadline does."""
        async with self.pool.connection() as connection:
            await connection.execute(
                "UPDATE flowforge_task SET not_before = now() "
                "- make_interval(secs => timeout_seconds + 1) "
                "WHERE run_id = %s AND task_key = %s AND role = 'forward'",
                (self.run_id, gate),
            )
        decision = await settle_run(self.pool, fence=self.fence, run_id=self.run_id)
        self.model.time_out(gate)
        event("a gate timed out")
        await self.step(f"the timeout of {gate} passes", decision, recorded=True)

    async def job_created(self, key: str, attempt: int) -> bool:
        job = JobCreated(
            task_key=key, attempt=attempt, job=f"{key}-{attempt}", uid=f"uid-{key}-{attempt}",
            created=True,
        )  # fmt: skip
        cancelled = await record_jobs_created(
            self.pool, fence=self.fence, run_id=self.run_id, jobs=(job,)
        )
        return (key, attempt) in cancelled

    async def step(
        self, label: str, decision: Decision, *, recorded: bool, person: bool = False
    ) -> None:
        self.log.append(f"{label} -> {'recorded' if decision.recorded else 'lost'}")
        note(self.log[-1])
        self.expect(decision.recorded == recorded, f"{label}: recorded={decision.recorded}")
        await self.compare(await _snapshot(self.pool, self.run_id), decision, person=person)

    async def compare(
        self, observed: dict[RowKey, Row], decision: Decision, *, person: bool = False
    ) -> None:
        model, before = self.model, self.rows
        expected = model.rows()
        self.expect(
            observed == expected,
            f"rows differ from the model\n  store: {_show(observed)}\n  model: {_show(expected)}",
        )
        # every change is a composition of the tables' moves
        for row_key, row in observed.items():
            if row_key in before and before[row_key] != row:
                self.expect(
                    move_allowed(row_key[0], before[row_key], row, person=person),
                    f"{row_key[1]}: {before[row_key]} -> {row} is not a move of the tables",
                )
        # the Jobs to create are exactly the attempts that started: never a gate's, none
        # while the run is paused
        started = {
            (key, row[1], role)
            for (role, key), row in observed.items()
            if row[0] == TaskState.RUNNING and before.get((role, key)) != row
        }
        created = [(d.task_key, d.attempt, d.role) for d in decision.create_jobs]
        self.expect(
            sorted(created) == sorted(started),
            f"Jobs to create {sorted(created)}, attempts started {sorted(started)}",
        )
        gates = {key for key, _, _ in created} & set(model.gates)
        self.expect(not gates, f"Jobs to create for the gates {sorted(gates)}")
        paused = model.paused and model.phase not in TERMINAL_RUN_PHASES
        self.expect(not (created and paused), f"Jobs to create {created} while paused")
        for key, attempt, _ in created:  # the applier creates them, and notes it
            cancelled = await self.job_created(key, attempt)
            self.expect(not cancelled, f"the Job of {key}#{attempt} is reported cancelled")
        for key, _, role in sorted(started):
            if role is TaskRole.FORWARD:
                self.ever_started.add(key)
            elif role is TaskRole.FINALLY:
                self.finals_started.append(key)
            elif not self.compensators_started or self.compensators_started[-1] != key:
                self.compensators_started.append(key)
        self.rows = observed
        tolerated = await self.tolerated()
        self.expect(
            tolerated == model.tolerated,
            f"tolerated items {sorted(tolerated)}, the model's {sorted(model.tolerated)}",
        )
        self.check_spec(observed, tolerated)
        # the run
        run = await get_run(self.pool, self.run_id)
        if run.phase != self.phase:
            self.expect(
                run.phase in RUN_TRANSITIONS[self.phase], f"run {self.phase} -> {run.phase}"
            )
        became = run.phase if run.phase != self.phase else None
        self.phase = run.phase
        self.expect(run.phase == model.phase, f"run is {run.phase}, the model {model.phase}")
        self.expect(decision.phase == became, f"decision.phase {decision.phase}, became {became}")
        flags = (
            run.compensating,
            run.cancel_requested,
            run.paused_at is not None,
            run.deferred_cancel is not None,
            run.recovering,
            run.final_phase,
            run.rollback_outcome,
        )
        expected_flags = (
            model.compensating,
            model.cancel_requested,
            model.paused,
            model.deferred_cancel,
            model.recovering,
            model.final_phase,
            model.rollback_outcome,
        )
        self.expect(
            flags == expected_flags,
            "compensating/cancel_requested/paused/deferred cancel/recovering/final phase/"
            f"rollback outcome {flags}, the model {expected_flags}",
        )

    async def tolerated(self) -> set[str]:
        """The forEach items the store marked tolerated (none without a forEach)."""
        if not self.model.shape.groups:
            return set()
        async with self.pool.connection() as connection:
            cursor = await connection.execute(
                "SELECT task_key FROM flowforge_task WHERE run_id = %s AND tolerated",
                (self.run_id,),
            )
            return {str(key) for (key,) in await cursor.fetchall()}

    def check_spec(self, observed: Mapping[RowKey, Row], tolerated: set[str]) -> None:
        """The spec's statements on the store's rows alone (and its tolerated items)."""
        model = self.model
        run_graph, shape = model.run_graph, model.shape
        forward = {key: state for (role, key), (state, _) in observed.items() if role == "forward"}

        def having(*states: str) -> set[str]:
            return {key for key, state in forward.items() if state in states}

        succeeded, failed = having(TaskState.SUCCEEDED), having(TaskState.FAILED) - tolerated
        finished = having(TaskState.FAILED, TaskState.SKIPPED, TaskState.CANCELLED)
        # a tolerated item releases its dependents as a success does
        released = set(run_graph.ready_tasks(succeeded | tolerated)) - finished
        waiting = having(TaskState.READY, TaskState.RUNNING, TaskState.AWAITING)
        self.expect(
            waiting == released,
            f"released {sorted(released)} != ready/running/awaiting {sorted(waiting)}",
        )
        # only gates await, and gates never run
        gates = set(self.model.gates)
        awaiting, runs = having(TaskState.AWAITING), having(TaskState.READY, TaskState.RUNNING)
        self.expect(
            awaiting <= gates and not runs & gates,
            f"awaiting {sorted(awaiting)}, ready/running {sorted(runs)}, gates {sorted(gates)}",
        )
        skipped = having(TaskState.SKIPPED)
        created = model.condition_false | shape.no_items
        expected_skips = set(run_graph.downstream_of(failed)) | created
        self.expect(
            skipped == expected_skips and not skipped & self.ever_started,
            f"skipped {sorted(skipped)}, downstream of failed, condition false or no items "
            f"{sorted(expected_skips)}, ever started {sorted(self.ever_started)}",
        )
        for group in shape.groups.values():
            self.check_group(group, forward, tolerated)
        running = [
            key
            for (role, key), (state, _) in observed.items()
            if role == "compensation" and state == CompensationState.RUNNING
        ]
        self.expect(len(running) <= 1, f"compensators running at once: {running}")
        limit = self.model.limit
        if limit is not None:  # maxParallelTasks counts forward tasks and compensators
            busy = having(TaskState.RUNNING) | set(running)
            self.expect(len(busy) <= limit, f"{sorted(busy)} running, maxParallelTasks {limit}")
        self.check_finals(observed)
        if self.compensators_started:
            attempted = model.attempted()
            self.expect(
                attempted <= failed | tolerated,
                f"undone as attempted {attempted}, failed {failed | tolerated}",
            )
            order = model.rollback_order(succeeded=succeeded, attempted=attempted)
            self.expect(
                tuple(self.compensators_started) == order[: len(self.compensators_started)],
                f"compensators started {self.compensators_started}, rollback order {order}",
            )

    def check_group(self, group: Group, forward: Mapping[str, str], tolerated: set[str]) -> None:
        """A forEach's items: never more than its maxParallel running; within its tolerance
        the failed ones are tolerated; past it none is unresolved (none starts any more)."""
        states = [forward[member] for member in group.members]
        running = states.count(TaskState.RUNNING)
        cap = group.max_parallel
        self.expect(
            cap is None or running <= cap, f"{group.task}: {running} items run, maxParallel {cap}"
        )
        failed = [m for m in group.members if forward[m] == TaskState.FAILED]
        within = len(failed) <= group.tolerance
        self.expect(
            (set(failed) <= tolerated) if within else len(set(failed) - tolerated) == 1,
            f"{group.task}: failed {failed}, tolerated {sorted(tolerated)}, "
            f"tolerance {group.tolerance}",
        )
        unresolved = [state for state in states if state in UNRESOLVED_TASK_STATES]
        self.expect(
            within or not unresolved, f"{group.task} past its tolerance, items still {states}"
        )

    def check_finals(self, observed: Mapping[RowKey, Row]) -> None:
        """The finally tasks on the store's rows alone: none starts before the outcome is
        decided (every forward task resolved, no compensator pending or running), then one at
        a time in list order (those before the running one finished, those after waiting)."""
        finals = [observed[(TaskRole.FINALLY, key)][0] for key in self.model.finals]
        if TaskState.RUNNING not in finals:
            return
        place = finals.index(TaskState.RUNNING)
        done = (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.SKIPPED)
        self.expect(
            all(state in done for state in finals[:place])
            and all(state == TaskState.WAITING for state in finals[place + 1 :]),
            f"finally tasks {finals}: not one at a time in list order",
        )
        unresolved = [
            key
            for (role, key), (state, _) in observed.items()
            if (role == TaskRole.FORWARD and state in UNRESOLVED_TASK_STATES)
            or (role == TaskRole.COMPENSATION and state in UNRESOLVED_COMPENSATION_STATES)
        ]
        self.expect(not unresolved, f"a finally task runs before {unresolved} settled")

    async def finish(self) -> None:
        """The run is over: its phase, its rollback and its history."""
        model = self.model
        counts = model.counts()
        # what the run's status shows: the tolerated items (PartialFailure), the tasks skipped
        # by their when (ConditionFalse), apart from the failed and the other skipped ones
        stored = await forward_counts(self.pool, self.run_id, kueue=False)
        self.expect(stored == counts, f"the store counts {stored}, the model {counts}")
        # a cancel while the finally tasks ran changed nothing: the phase was decided before
        cancel = model.cancel_requested if model.final_phase is None else model.cancel_when_decided
        expected = settled_phase(counts=counts, cancel_requested=cancel)
        self.expect(self.phase == expected, f"finished {self.phase}, settled_phase {expected}")
        self.expect(
            model.final_phase in (None, self.phase),
            f"finished {self.phase}, decided {model.final_phase}",
        )
        order = model.rollback_order()
        if model.triggered and all(
            model.resolved_compensators.get(key) is CompensationState.SUCCEEDED for key in order
        ):
            self.expect(
                tuple(self.compensators_started) == order,
                f"compensators ran {self.compensators_started}, rollback order {order}",
            )
        steps = [(s.task_key, s.state) for s in await rollback_steps(self.pool, self.run_id)]
        # the compensators of the succeeded (and attempted) tasks, once decided (a rollback
        # dropped with the object lists them skipped)
        expected_steps = [
            (key, model.compensation_state(key))
            for key in order
            if model.compensation_state(key) is not CompensationState.NOT_TRIGGERED
        ]
        self.expect(steps == expected_steps, f"rollback_steps {steps}, model {expected_steps}")
        history = await run_history(self.pool, self.run_id)
        kinds = [e.kind for e in history if e.kind != EventKind.TASK_JOB_CREATED]  # moves only
        tolerated = {
            str(e.task_key)
            for e in history
            if e.kind == EventKind.TASK_FAILED and e.detail.get("tolerated") is True
        }
        self.expect(
            tolerated == model.tolerated,
            f"failures told tolerated {sorted(tolerated)}, the model {sorted(model.tolerated)}",
        )
        announced = [e.detail.get("order") for e in history if e.kind == EventKind.RUN_COMPENSATING]
        self.expect(
            announced == ([list(model.rollback)] if model.rollback else []),
            f"rollback announced {announced}, the model's {model.rollback}",
        )
        started = [e.task_key for e in history if e.kind == EventKind.COMPENSATION_STARTED]
        collapsed = [key for key, _ in itertools.groupby(started)]
        self.expect(
            collapsed == self.compensators_started,
            f"history started {started}, observed {self.compensators_started}",
        )
        finalizing = [e.detail for e in history if e.kind == EventKind.RUN_FINALIZING]
        decided = (
            []
            if model.final_phase is None or model.rollback_outcome is None
            else [
                {
                    "phase": model.final_phase.value,
                    "rollback": model.rollback_outcome.value,
                    "order": list(model.finals),
                }
            ]
        )
        self.expect(finalizing == decided, f"finalizing {finalizing}, the model {decided}")
        finals = [e.task_key for e in history if e.kind == EventKind.FINALLY_STARTED]
        self.expect(
            finals == self.finals_started and self.finals_started == sorted(self.finals_started),
            f"history started finally {finals}, observed {self.finals_started}",
        )
        finishes = [
            k for k in kinds if k in {EventKind.run_finished(p) for p in TERMINAL_RUN_PHASES}
        ]
        # the last move (after it, only people's refused actions) is the run's finish, or the
        # settling of the rollback a person recovered
        moves = [k for k in kinds if k not in _ACTION_KINDS]
        recovered = [e for e in history if e.kind == EventKind.RUN_ROLLBACK_RECOVERED]
        finished = EventKind.run_finished(self.phase)
        last = EventKind.RUN_ROLLBACK_RECOVERED if recovered else finished
        self.expect(
            finishes == [finished] and moves[-1] == last,
            f"run-finished events {finishes}, last move {moves[-1]}",
        )
        self.check_people(history)

    def check_people(self, history: Sequence[Any]) -> None:
        """The history says what people did: each action once, accepted or refused as the
        model judged; who passed each gate, why each failed; each recovered rollback."""
        model = self.model
        actions = [(e.detail.get("uid"), e.kind) for e in history if e.kind in _ACTION_KINDS]
        self.expect(actions == self.actions, f"actions in the history {actions}, {self.actions}")
        for event_ in history:
            if event_.task_key not in model.gates:
                continue
            if event_.kind == EventKind.TASK_SUCCEEDED:
                approvers = model.approved_by[event_.task_key]
                self.expect(
                    event_.detail.get("approvedBy") == approvers,
                    f"{event_.task_key} passed by {event_.detail}, the model {approvers}",
                )
            if event_.kind == EventKind.TASK_FAILED:
                reason = model.gate_failures[event_.task_key]
                self.expect(
                    event_.detail.get("reason") == reason.value,
                    f"{event_.task_key} failed {event_.detail}, the model {reason}",
                )
        recovered = [e for e in history if e.kind == EventKind.RUN_ROLLBACK_RECOVERED]
        self.expect(
            len(recovered) == model.recovered,
            f"{len(recovered)} recovered rollbacks, the model {model.recovered}",
        )
        if recovered:
            halted = model.halted_at()
            self.expect(
                recovered[-1].detail.get("haltedAt") == halted,
                f"the recovered rollback {recovered[-1].detail}, halted at {halted}",
            )
