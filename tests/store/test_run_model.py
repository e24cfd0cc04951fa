"""The store held to the domain: random runs through the real store, step by step against a
pure model built from ``flowforge.domain``.

Each example draws a small DAG (2-8 forward tasks, ``retries`` 0-2, some with a compensator,
some of those with ``compensateOn: Attempted``, some forward tasks approval gates: listed
users or anyone, ``required`` 1-2, maybe ``forbidSelf``, maybe a timeout; the run created by
one of the people or nobody known; some tasks with a ``when`` on a boolean parameter, true
or false; half of the runs with 1-2 ``forEach`` tasks: 0-4 items from an array parameter
or a literal list, maybe ``maxParallel`` 1-3, ``tolerateFailures`` 0-2 or 50%, most of
them with a compensator; a third of the runs with 1-2 ``finally`` tasks, ``retries`` 0-1)
and then, one step at a time, which running attempt
finishes next and how (success, failure after its container started, or failure of a Pod
that never started; sometimes two forward attempts at once, recorded concurrently, but never
a forEach item's last attempt), a cancel
at a random point (keeping the rollback or, the object gone, dropping it), now and then an
outcome that arrives again (a replayed Job, a stale attempt, a cancelled one, a Job forged
for a gate), and people's steps: an ``Approve`` or ``Reject`` of a gate by one of the people
(an approver or not, the creator or not, one who approved already or not), a gate's timeout
passing, ``Pause``/``Resume``, ``RetryCompensator``/``SkipCompensator`` of a compensator,
each now and then applied a second time (the same object again). When nothing runs, a person
moves the run on (a resume, or a decision that counts on an awaiting gate); while its
``finally`` tasks run, now and then a cancel (changes nothing) or the object gone (the rest
skipped, the running one's Job stopped); when a finished
run's rollback halted, a person may recover it (retry or skip the halted compensator) and
the recovered rollback is driven to its end. Every step goes through the functions the
operator calls (``create_run``, ``dispatch_due``, ``record_outcome``, ``cancel_run``,
``apply_action``, ``settle_run``, which settle the run themselves, ``record_jobs_created``) on
the real PostgreSQL, and after every step the store's rows are compared with:

- the model (``model_runs.RunModel``): what the domain says every row is after the inputs so
  far (the rows ``create_run`` writes, worked out in ``model_dags.shape_of`` from the rules:
  a task whose ``when`` is false, or whose ``forEach`` has no items, skipped at creation and
  its dependents waiting for its own upstreams, a ``forEach`` task one row per item waiting
  for the task's upstreams, its dependents for every item, a compensator per item; the
  released tasks are ``graph.ready_tasks`` of the succeeded ones and the tolerated items,
  started in the rows' order as ``maxParallelTasks`` and each ``forEach``'s ``maxParallel``
  leave room, a released gate ``awaiting``, the skipped ones ``graph.downstream_of`` the
  failed ones, a rejected or timed-out gate among them; an item failing for good within its
  task's ``tolerateFailures`` tolerated, past it the task's other unresolved items cancelled
  and their Jobs stopped; the rollback ``graph.compensation_order`` of the tasks of the
  attempted rows (``undo.undo_of``, a tolerated item too), then of the succeeded ones, a
  ``forEach`` compensator's items the one completed last first, one at a time, halted by a
  compensator that fails for good, the phase ``projection.settled_phase``, which a run with
  ``finally`` tasks takes only once they ran: one at a time in list order, each with its own
  retries, a failed one not stopping the next, none while paused; an action accepted or refused as
  ``approval.approval_refusal``/``rejection_refusal`` and ``run_actions.pause_refusal``/
  ``recovery_refusal`` say, with their text; while paused nothing starts and a cancel waits
  for the resume), the run's flags (compensating, cancel requested, paused, a cancel kept,
  recovering, the decided phase and the rollback's outcome, ``final_phase`` and
  ``rollback_outcome``), the items the store marked tolerated, and the step's ``Decision``
  (recorded or lost, Jobs to create and to stop, never a Job of a gate, none while paused,
  the phase it finished in, a ``PartialFailure`` or ``ItemsStopped`` notice exactly when an
  item failed within or past its tolerance);
- the spec's own statements, on the store's rows alone (and the items it marked tolerated):
  ready/running/awaiting == ready_tasks of the succeeded and tolerated minus what finished,
  only gates await and gates never run, skipped == downstream_of the failed that are not
  tolerated, the ones whose ``when`` is false and the ``forEach`` tasks without items (none
  of which ever started), never more of a ``forEach``'s items running than its
  ``maxParallel``, its failed items all tolerated within its tolerance, past it exactly one
  not and none unresolved, at most one compensator running,
  the compensators started in exactly the rollback order, a ``finally`` task running only
  once every forward task is resolved and no compensator pending or running, the ones
  before it finished and the ones after it waiting;
- the state tables: every change between two snapshots is one move of ``TASK_TRANSITIONS``
  / ``COMPENSATION_TRANSITIONS`` / ``RUN_TRANSITIONS`` (a person's recovery first one of
  ``RECOVERY_TRANSITIONS``), or two in one transaction (a retry dispatched at once, a
  compensator triggered and started), and the attempt grows by one exactly on a retry move
  (``running -> ready`` / ``running -> pending``, a person's ``failed -> pending``), never
  otherwise; a ``finally`` row's moves are checked against the test's own small table
  (``model_checker.FINAL_TRANSITIONS``).

At the end the history must tell the same story (the rollback order announced, the
compensators started in that order, one run-finished event of the final phase, the last move
that or the recovered rollback's settling, every action once with its result, who passed
each gate and why each failed, the finalizing announced once with the decided phase, the
rollback's outcome and the order, the ``finally`` tasks started in list order, the failures
told tolerated exactly the tolerated items), and the run's counts as its status shows them
(``store.queries.forward_counts``: tolerated items apart, the ``PartialFailure`` condition's
input, and the tasks skipped ``ConditionFalse`` apart from the other skipped ones) must be
the model's.

The database is shared by all the examples (a fresh one each would take seconds per
example); each example publishes its own workflow and creates its own run under the same
lease. Backoff is 0 s without jitter, so a retry is due at once and dispatched by the move
that scheduled it.

Random concurrency rarely hits a narrow window: the interleaving known to matter (a success
and a failure for good ending a run together) is held open on purpose in
``test_outcomes.py::test_a_failure_and_a_success_finishing_together_settle_the_run``.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from flowforge.domain.approval import approval_refusal, rejection_refusal
from flowforge.domain.run_actions import Actor, RunActionKind
from flowforge.domain.states import CompensationState, TaskRole, TaskState
from flowforge.store.connection import Pool
from flowforge.store.lease import Fence
from tests.store.model_checker import Checker, move_allowed
from tests.store.model_dags import PEOPLE, Dag, dags
from tests.store.model_runs import Act, Job, RunModel

pytestmark = pytest.mark.store

MAX_REPLAYS = 6  # outcomes that arrive again, per run
MAX_ACTS = 8  # people's steps drawn at random, per run (besides those moving a run on)
MAX_RECOVERIES = 2  # recoveries of a halted rollback, per run

_again = st.integers(0, 3).map(lambda n: n == 3)
_people = st.sampled_from(PEOPLE)


def any_act(model: RunModel) -> st.SearchStrategy[Act]:
    """A person's step of any kind on any target: many are refused. While gates await, half
    the steps decide one of them, by the run's creator or one who approved it already as
    often as by anyone."""
    others = [key for key in model.topological if key not in model.gates][:1]
    gates = st.sampled_from(sorted(model.gates) + others)
    compensators = st.sampled_from(sorted(model.compensators.values()) or others or ["none"])
    kinds = RunActionKind
    decisions = st.sampled_from((kinds.APPROVE, kinds.APPROVE, kinds.REJECT))
    anything = st.one_of(
        st.builds(Act, decisions, gates, _people, _again),
        st.builds(Act, st.sampled_from((kinds.PAUSE, kinds.RESUME)), st.none(), _people, _again),
        st.builds(
            Act,
            st.sampled_from((kinds.RETRY_COMPENSATOR, kinds.SKIP_COMPENSATOR)),
            compensators,
            _people,
            _again,
        ),
    )
    deciding = []
    for gate in model.awaiting():
        known = [model.creator] if model.creator else []
        people = _people | st.sampled_from(known + model.approved_by[gate] or PEOPLE)
        deciding.append(st.builds(Act, decisions, st.just(gate), people, _again))
        if model.gates[gate].timeout_seconds:
            deciding.append(st.just(Act(None, gate)))
    return anything | st.one_of(deciding) if deciding else anything


def moving_on(model: RunModel) -> st.SearchStrategy[Act] | None:
    """The steps by which a person moves on a run where nothing runs: the resume of a paused
    run, an approval that counts, a rejection or the timeout of an awaiting gate (each kind
    as likely as the others)."""
    resumes = [Act(RunActionKind.RESUME)] if model.paused else []
    approvals, rejections, timeouts = [], [], []
    for gate in model.awaiting():
        approval = model.gates[gate]
        for person in PEOPLE:
            actor = Actor(username=person)
            if (
                approval_refusal(
                    gate=gate,
                    approval=approval,
                    actor=actor,
                    creator=model.creator,
                    approved_by=model.approved_by[gate],
                )
                is None
            ):
                approvals.append(Act(RunActionKind.APPROVE, gate, person))
            if rejection_refusal(gate=gate, approval=approval, actor=actor) is None:
                rejections.append(Act(RunActionKind.REJECT, gate, person))
        if approval.timeout_seconds:
            timeouts.append(Act(None, gate))
    kinds = [st.sampled_from(acts) for acts in (resumes, approvals, rejections, timeouts) if acts]
    return st.one_of(kinds) if kinds else None


def racing(model: RunModel, one: Job, other: Job) -> bool:
    """A forEach item on its last attempt ends alone: past its task's tolerance its failure
    cancels the task's other items, one of which the other outcome may have just started
    (or, of the same task, ended: its outcome is then lost), and within it which of two
    failing items is tolerated depends on which commits first."""
    return any(
        key in model.shape.group_of and model.attempts[key] >= model.attempt_limit[key]
        for key, _, _ in (one, other)
    )


def recovery(halted: str) -> st.SearchStrategy[Act]:
    kinds = st.sampled_from((RunActionKind.RETRY_COMPENSATOR, RunActionKind.SKIP_COMPENSATOR))
    return st.builds(Act, kinds, st.just(halted), _people, _again)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=False,
    # no explain phase: its tracing makes shrinking a failure take minutes
    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(dag=dags(), data=st.data())
async def test_random_runs_move_as_the_domain_says(
    store: Pool, fence: Fence, dag: Dag, data: st.DataObject
) -> None:
    checker = Checker(store, fence, dag)
    model = checker.model
    cancel_at = data.draw(st.none() | st.integers(min_value=0, max_value=12), label="cancel at")
    keep_rollback = data.draw(st.sampled_from((True, False)), label="cancel keeps the rollback")
    pause_at = data.draw(st.none() | st.integers(min_value=0, max_value=8), label="pause at")
    replays, replay_now = 0, st.integers(0, 5).map(lambda n: n == 5)
    acts, person_now = 0, st.integers(0, 3).map(lambda n: n == 3)
    recoveries = 0
    late_cancels, late_now = 0, st.integers(0, 4).map(lambda n: n == 4)
    outcomes = st.sampled_from(("success", "failure", "not started"))
    together = st.integers(0, 3).map(lambda n: n == 3)  # two forward attempts end at once
    await checker.create()
    for step in itertools.count():
        if model.over:
            # now and then a person acts on the finished run (refused, but for the recovery
            # of a halted rollback); or recovers a halted one
            if acts < MAX_ACTS and data.draw(person_now, label="a person acts at the end?"):
                acts += 1
                await checker.act(data.draw(any_act(model), label="the step"))
                continue
            halted = model.halted_at()
            if (
                halted is None
                or recoveries == MAX_RECOVERIES
                or not data.draw(st.integers(0, 3), label="a person recovers the rollback?")
            ):
                break
            recoveries += 1
            await checker.act(data.draw(recovery(halted), label="recovery"))
            continue
        checker.expect(step < 200, "the run never finishes")
        # the cancel comes at its step, or earlier while the run is paused (kept for the resume)
        if step == cancel_at or (
            cancel_at is not None
            and step < cancel_at
            and model.paused
            and data.draw(st.booleans(), label="cancel while paused?")
        ):
            cancel_at = step
            await checker.cancel(rollback=keep_rollback)
            await checker.cancel(rollback=keep_rollback)  # again: changes nothing
            continue
        if step == pause_at:
            await checker.act(Act(RunActionKind.PAUSE, person=data.draw(_people, label="pauses")))
            continue
        # while the finally tasks run: a cancel (changes nothing), or the object is gone
        if model.finalizing and late_cancels < 2 and data.draw(late_now, label="late cancel?"):
            late_cancels += 1
            await checker.cancel(rollback=data.draw(st.booleans(), label="late keeps rollback"))
            continue
        if replays < MAX_REPLAYS and checker.stale and data.draw(replay_now, label="replay?"):
            replays += 1
            job = data.draw(st.sampled_from(checker.stale), label="replayed attempt")
            ok = data.draw(st.booleans(), label="replayed as success")
            await checker.outcome(job, succeeded=ok, replay=True)
            continue
        jobs = model.running_jobs()
        # when nothing runs, only people move the run: mostly one of any kind
        chance = person_now if jobs else st.integers(0, 3).map(bool)
        if acts < MAX_ACTS and data.draw(chance, label="a person acts?"):
            acts += 1
            await checker.act(data.draw(any_act(model), label="the step"))
            continue
        if not jobs:
            moves = moving_on(model)
            checker.expect(moves is not None, f"the run is {model.phase} with nothing running")
            assert moves is not None
            await checker.act(data.draw(moves, label="moves the run on"))
            continue
        job = data.draw(st.sampled_from(jobs), label="finishes next")
        how = data.draw(outcomes, label="outcome")
        ended = [(job, how)]
        others = [
            other
            for other in jobs
            if other != job and other[2] is TaskRole.FORWARD and not racing(model, job, other)
        ]
        if job[2] is TaskRole.FORWARD and others and data.draw(together, label="together?"):
            other = data.draw(st.sampled_from(others), label="finishes at the same time")
            ended.append((other, data.draw(outcomes, label="its outcome")))
            event("two attempts ended together")
        await checker.outcomes(ended)
    for job in checker.stale[-3:]:  # outcomes arriving after the run finished change nothing
        await checker.outcome(job, succeeded=True, replay=True)
    await checker.finish()
    event(f"finished {model.phase}")
    if model.rollback:
        stopped = CompensationState.FAILED in model.resolved_compensators.values()
        event(f"rollback of {len(model.rollback)}" + (", halted" if stopped else ""))
    if model.attempted():
        event("a failed attempt undone")
    if any(attempt > 1 for attempt in model.attempts.values()):
        event("a retry")
    if model.condition_false:
        event("a task skipped by its when")
    for group in model.shape.groups.values():
        event(f"a forEach of {len(group.members)} items")
        if group.max_parallel is not None and group.max_parallel < len(group.members):
            event("a forEach held to its maxParallel")
    undone = [key for key in model.rollback if "[" in key]
    if (
        len(undone) > 1
        and model.resolved_compensators.get(undone[-1]) is CompensationState.SUCCEEDED
    ):
        event("a forEach compensator undid several items")
    for gate in model.gates:
        event(f"a gate {model.task_state(gate)}")
    if model.recovered:
        event("a recovered rollback settled")
    if model.final_phase is not None:
        event(f"finally after {model.final_phase}, rollback {model.rollback_outcome}")
        states = sorted({str(state) for state in model.final_states.values()})
        event(f"finally tasks ended {'+'.join(states)}")
    if model.final_phase is not None and model.cancel_requested != model.cancel_when_decided:
        event("cancelled while finalizing, the outcome stood")


def test_the_model_rejects_moves_the_tables_forbid() -> None:
    """The transition check itself: a forbidden move, and an attempt that grows off a retry."""
    forward, compensation = TaskRole.FORWARD, TaskRole.COMPENSATION
    assert move_allowed(forward, (TaskState.RUNNING, 1), (TaskState.RUNNING, 2))
    assert move_allowed(forward, (TaskState.WAITING, 1), (TaskState.RUNNING, 1))
    assert move_allowed(forward, (TaskState.WAITING, 1), (TaskState.AWAITING, 1))
    assert not move_allowed(forward, (TaskState.RUNNING, 1), (TaskState.RUNNING, 1))
    assert not move_allowed(forward, (TaskState.RUNNING, 1), (TaskState.READY, 1))
    assert not move_allowed(forward, (TaskState.FAILED, 1), (TaskState.RUNNING, 2))
    assert not move_allowed(forward, (TaskState.WAITING, 1), (TaskState.RUNNING, 2))
    assert not move_allowed(forward, (TaskState.AWAITING, 1), (TaskState.RUNNING, 1))
    assert move_allowed(
        compensation, (CompensationState.NOT_TRIGGERED, 1), (CompensationState.RUNNING, 1)
    )
    assert not move_allowed(
        compensation, (CompensationState.SKIPPED, 1), (CompensationState.PENDING, 1)
    )
    # a person's recovery: the halted one runs again with its attempt + 1, the skipped ones
    # are pending again; never without a person, never an attempt that does not grow
    failed, pending = (CompensationState.FAILED, 2), (CompensationState.PENDING, 3)
    assert move_allowed(compensation, failed, (CompensationState.RUNNING, 3), person=True)
    assert move_allowed(compensation, failed, (CompensationState.SKIPPED, 2), person=True)
    assert move_allowed(
        compensation, (CompensationState.SKIPPED, 1), (CompensationState.PENDING, 1), person=True
    )
    assert not move_allowed(compensation, failed, pending)
    assert not move_allowed(compensation, failed, (CompensationState.PENDING, 2), person=True)
    assert not move_allowed(compensation, (CompensationState.SUCCEEDED, 1), pending, person=True)
    # a finally task: started, retried at once (attempt + 1), skipped; never back to waiting,
    # never a forward task's moves
    waiting, ready, running = TaskState.WAITING, TaskState.READY, TaskState.RUNNING
    final_moves = {
        ((waiting, 1), (running, 1)): True,
        ((running, 1), (running, 2)): True,
        ((ready, 2), (TaskState.SKIPPED, 2)): True,
        ((running, 1), (waiting, 1)): False,
        ((waiting, 1), (ready, 1)): False,
        ((running, 1), (TaskState.CANCELLED, 1)): False,
        ((TaskState.FAILED, 1), (running, 2)): False,
    }
    for (before, after), allowed in final_moves.items():
        assert move_allowed(TaskRole.FINALLY, before, after) is allowed, (before, after)
