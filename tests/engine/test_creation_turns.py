"""Job creations are paced and served round-robin per namespace (``creation_turns.py``):
one tenant's fan-out does not hold another tenant's next Job behind its whole backlog
(real PostgreSQL, the Kubernetes fake, a fake clock that alone lets tokens accrue)."""

from __future__ import annotations

import asyncio

import pytest

from flowforge.store.connection import Pool
from tests.engine.conftest import engine_settings, open_harness, task_of_job
from tests.engine.fake_clock import FakeClock
from tests.support.waiting import wait_until

pytestmark = pytest.mark.store

RATE = 10.0  # Job creations a second
BURST = 5
ROOTS = 2_000


async def test_a_fan_out_delays_another_namespaces_next_job_by_one_turn(
    store: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    settings = engine_settings(job_creation_qps=RATE, job_creation_burst=BURST)
    async with open_harness(store, settings=settings, clock=clock) as harness:
        turns = harness.engine.launcher.turns
        asked: list[str] = []  # the namespaces of the creations that asked for a turn
        take = turns.take

        async def spied(namespace: str) -> None:
            asked.append(namespace)
            await take(namespace)

        monkeypatch.setattr(turns, "take", spied)
        roots = [{"key": f"r{n}"} for n in range(ROOTS)]
        wide = asyncio.create_task(harness.start("wide", roots, namespace="team-a"))
        await wait_until(lambda: len(asked) == ROOTS, what="team-a's creations waiting")
        assert len(harness.kube.created) == BURST
        assert clock.pending() == [pytest.approx(1 / RATE)]  # the rest wait, on one timer
        one = asyncio.create_task(harness.start("one", [{"key": "only"}], namespace="team-b"))
        await wait_until(lambda: "team-b" in asked, what="team-b's creation waiting")

        for served in range(1, 4):  # three tokens: one of team-a's, team-b's, team-a's again
            clock.advance(1 / RATE)
            await wait_until(
                lambda served=served: len(harness.kube.created) == BURST + served,
                what=f"token {served} used",
            )

        jobs = {job["metadata"]["name"]: job for job in harness.kube.jobs.values()}
        after = [
            (jobs[name]["metadata"]["namespace"], task_of_job(jobs[name]))
            for name in harness.kube.created[BURST:]
        ]
        assert [namespace for namespace, _ in after] == ["team-a", "team-b", "team-a"]
        assert after[1] == ("team-b", "only")
        await asyncio.wait_for(one, timeout=10)  # its Job recorded
        assert not wide.done()  # team-a's fan-out goes on at the pace
        wide.cancel()
