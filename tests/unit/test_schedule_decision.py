"""The fire decision of a WorkflowSchedule: overlap policies, catch-up, backfills, and the
invariants that make each nominal time fire once (property tests over simulated passes)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from flowforge.domain.schedule import ScheduleSpec, parse_schedule_spec
from flowforge.domain.schedule_decision import (
    MAX_CATCHUP,
    MissedReason,
    ScheduleView,
    decide,
)

T0 = datetime(2026, 12, 2, 2, 0, tzinfo=UTC)


def every(seconds: int = 15, **fields: Any) -> ScheduleSpec:
    return parse_schedule_spec({"workflow": "etl", "schedule": f"@every {seconds}s", **fields})


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_one_due_time_fires_and_moves_the_watermark() -> None:
    decision = decide(every(), ScheduleView(now=at(16), since=at(1)))
    assert [fire.nominal for fire in decision.fire] == [at(15)]
    assert decision.watermark == at(15)
    assert decision.missed == {}
    # the next pass before the next time decides nothing
    again = decide(every(), ScheduleView(now=at(29), since=at(15)))
    assert again.fire == () and again.watermark == at(15) and not again.changed


def test_a_time_before_the_schedule_existed_is_not_owed() -> None:
    decision = decide(every(), ScheduleView(now=at(14), since=at(1)))
    assert decision.fire == ()


def test_skip_does_not_start_a_run_while_one_is_active_and_counts_it() -> None:
    decision = decide(every(), ScheduleView(now=at(16), since=at(0), active=("etl-1",)))
    assert decision.fire == ()
    assert decision.missed == {MissedReason.OVERLAP: 1}
    assert decision.watermark == at(15)


def test_allow_starts_anyway() -> None:
    decision = decide(
        every(overlapPolicy="Allow"), ScheduleView(now=at(16), since=at(0), active=("a",))
    )
    assert [fire.nominal for fire in decision.fire] == [at(15)]


def test_queue_keeps_one_waiting_and_fires_it_when_nothing_is_active() -> None:
    spec = every(overlapPolicy="Queue")
    first = decide(spec, ScheduleView(now=at(16), since=at(0), active=("a",)))
    assert first.fire == () and first.queued == at(15)
    second = decide(spec, ScheduleView(now=at(31), since=at(15), active=("a",), queued=at(15)))
    assert second.fire == () and second.queued == at(15)
    assert second.missed == {MissedReason.OVERLAP: 1}
    third = decide(spec, ScheduleView(now=at(32), since=at(30), queued=at(15)))
    assert [fire.nominal for fire in third.fire] == [at(15)] and third.queued is None


def test_replace_cancels_the_active_run_and_waits_for_it_to_settle() -> None:
    spec = every(overlapPolicy="Replace")
    first = decide(spec, ScheduleView(now=at(16), since=at(0), active=("old",)))
    assert first.fire == () and first.queued == at(15) and first.cancel == ("old",)
    # still rolling back: asked again, nothing fires
    waiting = decide(spec, ScheduleView(now=at(20), since=at(15), active=("old",), queued=at(15)))
    assert waiting.fire == () and waiting.cancel == ("old",)
    # a newer time replaces the waiting one
    newer = decide(spec, ScheduleView(now=at(31), since=at(15), active=("old",), queued=at(15)))
    assert newer.queued == at(30) and newer.missed == {MissedReason.REPLACED: 1}
    settled = decide(spec, ScheduleView(now=at(33), since=at(30), queued=at(30)))
    assert [fire.nominal for fire in settled.fire] == [at(30)] and settled.cancel == ()


def test_after_a_suspension_latest_fires_the_newest_and_all_fires_each_oldest_first() -> None:
    view = ScheduleView(now=at(50), since=at(0))
    latest = decide(every(overlapPolicy="Allow"), view)
    assert [fire.nominal for fire in latest.fire] == [at(45)]
    assert latest.missed == {MissedReason.SUPERSEDED: 2}
    every_one = decide(every(overlapPolicy="Allow", catchup={"mode": "All"}), view)
    assert [fire.nominal for fire in every_one.fire] == [at(15), at(30), at(45)]
    assert every_one.missed == {}


def test_while_suspended_nothing_is_decided_and_resuming_catches_up() -> None:
    view = ScheduleView(now=at(50), since=at(0))
    assert decide(every(suspend=True), view).fire == ()
    assert decide(every(suspend=True), view).watermark == at(0)


def test_times_outside_the_window_are_missed_and_counted() -> None:
    spec = every(overlapPolicy="Allow", catchup={"windowSeconds": 20, "mode": "All"})
    decision = decide(spec, ScheduleView(now=at(100), since=at(0)))
    assert [fire.nominal for fire in decision.fire] == [at(90)]
    assert decision.missed == {MissedReason.OUTSIDE_WINDOW: 5}
    assert decision.watermark == at(90)


def test_all_fires_at_most_100_and_counts_the_rest_never_silently() -> None:
    spec = every(10, overlapPolicy="Allow", catchup={"windowSeconds": 86400, "mode": "All"})
    decision = decide(spec, ScheduleView(now=at(1500), since=at(0)))
    assert len(decision.fire) == MAX_CATCHUP
    assert decision.too_many == 50 and decision.missed == {MissedReason.TOO_MANY: 50}
    assert decision.fire[0].nominal == at(510) and decision.fire[-1].nominal == at(1500)


def test_a_cron_catch_up_in_a_zone() -> None:
    spec = parse_schedule_spec(
        {
            "workflow": "etl",
            "schedule": "0 * * * *",
            "timeZone": "Europe/Paris",
            "catchup": {"windowSeconds": 7200, "mode": "All"},
            "overlapPolicy": "Allow",
        }
    )
    decision = decide(spec, ScheduleView(now=at(5 * 3600 + 1), since=at(0)))
    assert [fire.nominal for fire in decision.fire] == [at(4 * 3600), at(5 * 3600)]
    assert decision.missed == {MissedReason.OUTSIDE_WINDOW: 3}


def test_a_backfill_fires_its_times_once_whatever_the_overlap() -> None:
    spec = parse_schedule_spec(
        {
            "workflow": "etl",
            "schedule": "0 2 * * *",
            "backfills": [
                {"id": "july", "from": "2026-07-01T00:00:00Z", "to": "2026-07-05T23:59:59Z"}
            ],
        }
    )
    view = ScheduleView(now=at(10), since=at(5), active=("busy",))
    decision = decide(spec, view)
    assert [(fire.nominal.day, fire.backfill) for fire in decision.fire] == [
        (day, "july") for day in range(1, 6)
    ]
    assert decision.backfills_done == ("july",)
    assert (
        decide(spec, dataclasses.replace(view, processed_backfills=frozenset({"july"}))).fire == ()
    )
    fired = frozenset(fire.nominal for fire in decision.fire[:2])
    rest = decide(spec, dataclasses.replace(view, fired=fired))
    assert [fire.nominal.day for fire in rest.fire] == [3, 4, 5]


def test_a_manual_trigger_obeys_the_overlap_policy() -> None:
    busy = ScheduleView(now=at(3), since=at(0), active=("a",), trigger=at(3))
    assert decide(every(), busy).fire == ()
    assert decide(every(), busy).missed == {MissedReason.OVERLAP: 1}
    free = dataclasses.replace(busy, active=())
    (fire,) = decide(every(), free).fire
    assert fire.manual and fire.nominal == at(3)


@settings(max_examples=80, deadline=None)
@given(
    policy=st.sampled_from(["Skip", "Allow", "Queue", "Replace"]),
    mode=st.sampled_from(["Latest", "All"]),
    window=st.integers(min_value=10, max_value=400),
    steps=st.lists(
        st.tuples(st.integers(min_value=1, max_value=120), st.booleans(), st.booleans()),
        min_size=1,
        max_size=30,
    ),
)
def test_simulated_passes_never_fire_a_time_twice_and_fire_oldest_first(
    policy: str, mode: str, window: int, steps: list[tuple[int, bool, bool]]
) -> None:
    """Passes at random moments, suspended or not, with runs that finish at random: every
    fired time is a nominal time, fired once, and each pass fires its times oldest first."""
    now = at(0)
    since = now
    queued: datetime | None = None
    active: list[str] = []
    fired: list[datetime] = []
    for advance, suspended, finish in steps:
        now += timedelta(seconds=advance)
        if finish:
            active.clear()
        spec = every(
            15,
            overlapPolicy=policy,
            suspend=suspended,
            catchup={"windowSeconds": window, "mode": mode},
        )
        decision = decide(
            spec, ScheduleView(now=now, since=since, active=tuple(active), queued=queued)
        )
        times = [fire.nominal for fire in decision.fire]
        assert times == sorted(times)
        assert all(int(instant.timestamp()) % 15 == 0 and instant <= now for instant in times)
        fired.extend(times)
        active.extend(f"run-{instant:%H%M%S}" for instant in times)
        if policy == "Skip" and times:
            assert len(times) == 1  # Skip never starts two at once
        assert decision.watermark is not None and decision.watermark >= since
        since = decision.watermark
        queued = decision.queued
        assert queued is None or queued <= since
    assert len(fired) == len(set(fired))
