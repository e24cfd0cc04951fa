"""Nominal times of a WorkflowSchedule: cron in a zone (both daylight-saving transitions of
America/Los_Angeles), intervals, derived run names, and refusals naming the field."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowforge.domain.schedule import ScheduleSpecError, parse_schedule_spec
from flowforge.domain.schedule_times import (
    TZDATA_VERSION,
    CronExpression,
    Interval,
    ScheduleExpressionError,
    TimeZoneError,
    count_between,
    next_times,
    parse_expression,
    run_name,
    times_between,
    zone_named,
)

LA = zone_named("America/Los_Angeles")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def local(times: list[datetime]) -> list[str]:
    return [instant.astimezone(LA).strftime("%Y-%m-%d %H:%M %Z") for instant in times]


def test_spring_forward_a_wall_time_that_does_not_exist_fires_at_the_next_valid_instant() -> None:
    # 2026-03-08: at 02:00 PST clocks jump to 03:00 PDT; 02:30 does not exist that day
    expression = parse_expression("30 2 * * *")
    times = times_between(expression, LA, utc(2026, 3, 6, 12), utc(2026, 3, 9, 12), limit=10)
    assert local(times) == [
        "2026-03-07 02:30 PST",
        "2026-03-08 03:00 PDT",  # the transition itself: 10:00 UTC
        "2026-03-09 02:30 PDT",
    ]
    assert times[1] == utc(2026, 3, 8, 10)


def test_spring_forward_several_missing_times_and_a_real_one_fire_once() -> None:
    expression = parse_expression("*/20 2-3 8 3 *")
    times = times_between(expression, LA, utc(2026, 3, 8, 0), utc(2026, 3, 8, 23), limit=20)
    # 02:00, 02:20, 02:40 do not exist and 03:00 does: all four are the one instant 03:00
    assert local(times) == ["2026-03-08 03:00 PDT", "2026-03-08 03:20 PDT", "2026-03-08 03:40 PDT"]


def test_fall_back_a_wall_time_that_occurs_twice_fires_once_at_its_first_occurrence() -> None:
    # 2026-11-01: at 02:00 PDT clocks go back to 01:00 PST; 01:30 occurs twice
    expression = parse_expression("30 1 * * *")
    times = times_between(expression, LA, utc(2026, 10, 31, 0), utc(2026, 11, 2, 23), limit=10)
    assert local(times) == [
        "2026-10-31 01:30 PDT",
        "2026-11-01 01:30 PDT",
        "2026-11-02 01:30 PST",
    ]


def test_fall_back_an_hourly_expression_does_not_fire_the_repeated_hour_again() -> None:
    expression = parse_expression("0,30 * * * *")
    times = times_between(
        expression, LA, utc(2026, 11, 1, 7, 45), utc(2026, 11, 1, 10, 59), limit=20
    )
    assert local(times) == [
        "2026-11-01 01:00 PDT",
        "2026-11-01 01:30 PDT",
        "2026-11-01 02:00 PST",  # 01:00 and 01:30 PST (the second pass) do not fire
        "2026-11-01 02:30 PST",
    ]


def test_starting_inside_the_repeated_hour_does_not_fire_its_first_pass_again() -> None:
    expression = parse_expression("45 1 * * *")
    second_pass = datetime(2026, 11, 1, 1, 10, tzinfo=LA, fold=1)  # 01:10 PST
    assert local(next_times(expression, LA, second_pass, 1)) == ["2026-11-02 01:45 PST"]


@settings(max_examples=60, deadline=None)
@given(
    expression=st.sampled_from(
        ["*/7 * * * *", "30 1 * * *", "0 2 * * *", "*/20 1-3 * * *", "5 0 * * 0"]
    ),
    start=st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2027, 12, 1)),
    zone=st.sampled_from(["America/Los_Angeles", "Europe/Paris", "Australia/Lord_Howe", "UTC"]),
)
def test_nominal_times_strictly_increase_and_each_names_one_run(
    expression: str, start: datetime, zone: str
) -> None:
    tz = zone_named(zone)
    parsed = parse_expression(expression)
    after = start.replace(tzinfo=UTC)
    times = times_between(parsed, tz, after, after + timedelta(days=3), limit=2000)
    assert all(earlier < later for earlier, later in itertools.pairwise(times))
    assert all(instant > after for instant in times)
    names = [run_name("s", parsed, tz, instant) for instant in times]
    assert len(set(names)) == len(names)
    # resuming from any time seen yields exactly the rest
    if len(times) > 2:
        middle = times[len(times) // 2]
        rest = times_between(parsed, tz, middle, after + timedelta(days=3), limit=2000)
        assert rest == [instant for instant in times if instant > middle]


def test_intervals_are_multiples_of_the_interval_since_the_epoch_whatever_the_zone() -> None:
    every = parse_expression("@every 15s")
    assert every == Interval(15)
    times = times_between(every, LA, utc(2026, 12, 2, 2, 0, 7), utc(2026, 12, 2, 2, 1), limit=10)
    assert times == [
        utc(2026, 12, 2, 2, 0, 15),
        utc(2026, 12, 2, 2, 0, 30),
        utc(2026, 12, 2, 2, 0, 45),
        utc(2026, 12, 2, 2, 1),
    ]
    assert count_between(every, LA, utc(2026, 12, 2), utc(2026, 12, 2, 1)) == 240
    assert parse_expression("@every 5m") == Interval(300)
    assert parse_expression("@every 1h") == Interval(3600)


def test_run_names_derive_from_the_nominal_time() -> None:
    paris = zone_named("Europe/Paris")
    nightly = parse_expression("0 2 * * *")
    (first,) = next_times(nightly, paris, utc(2026, 12, 1, 12), 1)
    assert run_name("nightly-etl", nightly, paris, first) == "nightly-etl-202612020200"
    every = parse_expression("@every 30s")
    assert run_name("poll", every, paris, utc(2026, 12, 2, 2, 0, 30)) == "poll-20261202020030"
    # a manual trigger's time carries its seconds, so it never takes a cron time's name
    assert (
        run_name("nightly-etl", nightly, paris, utc(2026, 12, 2, 1, 0, 12))
        == "nightly-etl-20261202020012"
    )


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("@every 5s", "under the minimum of 10s"),
        ("@every 9s", "under the minimum"),
        ("@every 1.5m", "not an interval"),
        ("@every", "not an interval"),
        ("* * * *", "5-field"),
        ("0 0 * * * *", "5-field"),
        ("61 * * * *", "not a valid cron expression"),
        ("0 0 30 2 *", "not a valid cron expression"),
        ("@daily", "5-field"),
    ],
)
def test_bad_expressions_are_refused(text: str, fragment: str) -> None:
    with pytest.raises(ScheduleExpressionError, match=fragment):
        parse_expression(text)


def test_good_expressions_parse() -> None:
    assert parse_expression("  0  2 * * MON-FRI ") == CronExpression("0 2 * * MON-FRI")
    assert parse_expression("@every 10s") == Interval(10)


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "/etc/passwd", "../UTC", "Europe/Paris "])
def test_unknown_zones_are_refused(name: str) -> None:
    with pytest.raises(TimeZoneError):
        zone_named(name)


def test_zones_come_from_the_tzdata_package() -> None:
    assert TZDATA_VERSION != "unknown"
    assert zone_named("Europe/Paris").key == "Europe/Paris"


@pytest.mark.parametrize(
    ("spec", "field", "fragment"),
    [
        ({"workflow": "etl", "schedule": "@every 5s"}, "spec.schedule", "minimum of 10s"),
        ({"workflow": "etl", "schedule": "99 * * * *"}, "spec.schedule", "cron"),
        (
            {"workflow": "etl", "schedule": "@every 30s", "timeZone": "Mars/Base"},
            "spec.timeZone",
            "unknown time zone",
        ),
        (
            {"workflow": "etl", "schedule": "@every 30s", "overlapPolicy": "Forbid"},
            "spec.overlapPolicy",
            "Skip",
        ),
        (
            {"workflow": "etl", "schedule": "@every 30s", "catchup": {"windowSeconds": 1}},
            "spec.catchup.windowSeconds",
            "10",
        ),
        ({"workflow": "etl", "schedule": "@every 30s", "nope": 1}, "spec.nope", "Extra"),
        ({"schedule": "@every 30s"}, "spec.workflow", "required"),
        (
            {
                "workflow": "etl",
                "schedule": "@every 30s",
                "backfills": [
                    {"id": "a", "from": "2026-07-01T00:00:00", "to": "2026-07-02T00:00:00Z"}
                ],
            },
            "spec.backfills[0].from",
            "zone offset",
        ),
        (
            {
                "workflow": "etl",
                "schedule": "@every 30s",
                "backfills": [
                    {"id": "a", "from": "2026-07-02T00:00:00Z", "to": "2026-07-01T00:00:00Z"}
                ],
            },
            "spec.backfills",
            "before",
        ),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(
    spec: dict[str, object], field: str, fragment: str
) -> None:
    with pytest.raises(ScheduleSpecError) as refused:
        parse_schedule_spec(spec)
    assert refused.value.field == field
    assert fragment in refused.value.message


def test_the_issue_example_parses_with_defaults() -> None:
    spec = parse_schedule_spec(
        {
            "workflow": "etl",
            "version": 3,
            "parameters": {"mode": "incremental"},
            "schedule": "0 2 * * *",
            "timeZone": "Europe/Paris",
            "overlapPolicy": "Skip",
            "catchup": {"windowSeconds": 3600, "mode": "Latest"},
            "suspend": False,
            "backfills": [
                {"id": "july-fix", "from": "2026-07-01T00:00:00Z", "to": "2026-07-31T23:59:59Z"}
            ],
            "history": {"succeeded": 3, "failed": 3},
        }
    )
    assert spec.backfills[0].from_ == utc(2026, 7, 1)
    assert parse_schedule_spec({"workflow": "etl", "schedule": "@every 30s"}).time_zone == "UTC"
