"""The engine settles a run knowing its definition: a run of a definition without approval
gates never looks for an overdue gate (neither the probe after a success nor the locked
settle after a failure), and a run with a gate still fails it once its timeout has passed,
at the reconciler's pass after a restart lost its wake-up."""

from __future__ import annotations

import pytest

from flowforge.domain.states import RunPhase, TaskState
from flowforge.store import gates, moves
from tests.engine.conftest import Harness

pytestmark = pytest.mark.store


async def test_a_run_without_gates_never_looks_for_an_overdue_gate(
    harness: Harness, statements: list[str]
) -> None:
    run = await harness.start("plain", [{"key": "build"}, {"key": "lint"}])
    statements.clear()

    await harness.finish("lint", succeeded=False)  # settled under the run's lock: build runs
    await harness.finish("build")  # the probe finds no work left, the settle fails the run

    assert (await harness.run(run)).phase is RunPhase.FAILED
    assert moves.WORK_PROBE_QUERY in statements
    assert gates.OVERDUE_QUERY not in statements
    assert moves.SETTLE_PROBE_QUERY not in statements


async def test_a_run_with_a_gate_fails_it_at_the_pass_after_its_timeout(harness: Harness) -> None:
    run = await harness.start(
        "gated",
        [
            {"key": "build"},
            {"key": "approve", "dependsOn": ["build"], "approval": {"timeoutSeconds": 60}},
            {"key": "deploy", "dependsOn": ["approve"]},
        ],
    )
    await harness.finish("build")
    assert (await harness.states(run))["approve"] == TaskState.AWAITING
    async with harness.pool.connection() as connection:  # its deadline passed meanwhile
        await connection.execute(
            "UPDATE flowforge_task SET not_before = not_before - interval '61 seconds' "
            "WHERE run_id = %s AND task_key = 'approve'",
            (run.run_id,),
        )

    await harness.reconciler.pass_once()

    tasks = await harness.states(run)
    assert (tasks["approve"], tasks["deploy"]) == (TaskState.FAILED, TaskState.SKIPPED)
    assert (await harness.run(run)).phase is RunPhase.FAILED
