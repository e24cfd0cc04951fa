"""A wake-up is timed on one clock: the database's, which set the due time (real
PostgreSQL, the Kubernetes fake, a fake clock for the timers).

A retry's ``not_before`` is written by the database (``now() + backoff``); the operator once
turned it into a delay against its own wall clock, so an operator 30 s ahead woke the run
up 30 s early (and again and again, finding nothing due) and one 30 s behind woke it 30 s
late. The store now says how many seconds are left, measured by the database.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, tzinfo

import pytest

from flowforge.domain.execution import BackoffPolicy
from flowforge.domain.states import TaskState
from flowforge.store.connection import Pool
from tests.engine.conftest import Harness, engine_settings, open_harness
from tests.engine.fake_clock import FakeClock
from tests.support.waiting import wait_until

pytestmark = pytest.mark.store

BACKOFF_SECONDS = 1.0
SKEW = timedelta(seconds=30)


@pytest.fixture
async def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=[SKEW, -SKEW], ids=["operator-ahead", "operator-behind"])
def operator_clock_off(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every operator module's wall clock (``datetime.now``) is 30 s off the database's."""
    skew: timedelta = request.param

    class Skewed(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> Skewed:
            moment = datetime.now(tz) + skew
            return cls.fromtimestamp(moment.timestamp(), tz)

    for name, module in list(sys.modules.items()):
        if name.startswith("flowforge.operator") and getattr(module, "datetime", None) is datetime:
            monkeypatch.setattr(module, "datetime", Skewed)


@pytest.fixture
async def harness(store: Pool, clock: FakeClock) -> AsyncIterator[Harness]:
    settings = engine_settings(backoff=BackoffPolicy(first_delay_seconds=BACKOFF_SECONDS, jitter=0))
    async with open_harness(store, settings=settings, clock=clock) as opened:
        yield opened


@pytest.mark.usefixtures("operator_clock_off")
async def test_a_retrys_wake_up_is_on_time_whatever_the_operators_clock_says(
    harness: Harness, clock: FakeClock
) -> None:
    run = await harness.start("skewed", [{"key": "x", "retries": 1}])
    await harness.finish("x", succeeded=False)
    assert await harness.states(run) == {"x": TaskState.READY}

    # one timer: the wake-up, due when the backoff is over (less what the move took)
    assert len(clock.pending()) == 1
    delay = clock.pending()[0]
    assert BACKOFF_SECONDS - 0.5 < delay <= BACKOFF_SECONDS + 0.011, delay

    await asyncio.sleep(delay + 0.05)  # the backoff is over in the database's time too
    assert clock.advance(delay) == 1
    await wait_until(
        lambda: any("-x-2-" in name for name in harness.kube.created), what="attempt 2's Job"
    )
