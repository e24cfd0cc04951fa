"""Nominal times of a schedule: a 5-field cron expression in an IANA zone, or ``@every N``.

**Cron.** The expression is matched against the zone's *wall clock* (``cronsim``, which
reads naive datetimes as they are), and each matching wall time becomes one instant:

- a wall time that occurs twice (the hour repeated when clocks go back) fires **once**, at
  its first occurrence; in the repeated hour nothing fires again;
- a wall time that does not exist (the hour skipped when clocks go forward) fires at the
  **next valid instant**, the transition itself (02:30 on a spring-forward day in
  America/Los_Angeles fires at 03:00 PDT); several such times, or one that lands on a time
  the expression also names, fire once.

So the nominal times are strictly increasing and each wall time fires at most once. A
schedule's name for a time is its wall time in the zone (``nightly-etl-202612020200``).

**Intervals** (``@every 30s``, ``5m``, ``1h``; at least 10 s) are durations: their times are
the multiples of the interval since the Unix epoch, whatever the zone (so two operators, or
one restarted, compute the same times), and the name is the UTC time with seconds
(``poll-20261202020030``).

The zone comes from ``zoneinfo`` over the ``tzdata`` package (``TZDATA_VERSION``), never the
host's files, so every process computes the same instants.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from importlib.metadata import PackageNotFoundError, version
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

MIN_INTERVAL_SECONDS = 10
MAX_INTERVAL_SECONDS = 366 * 86400
_EVERY = re.compile(r"^@every\s+(\d{1,9})(s|m|h)$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}
# the longest a cron expression may go without a time (cronsim searches years ahead)
_PROBE_LIMIT = 1000


def _tzdata_version() -> str:
    try:
        return version("tzdata")
    except PackageNotFoundError:  # pragma: no cover - a dependency of the package
        return "unknown"


TZDATA_VERSION = _tzdata_version()


class ScheduleExpressionError(ValueError):
    """A ``spec.schedule`` that is neither a 5-field cron expression nor ``@every N``."""


class TimeZoneError(ValueError):
    """A ``spec.timeZone`` that names no IANA zone."""


@dataclasses.dataclass(frozen=True)
class CronExpression:
    text: str


@dataclasses.dataclass(frozen=True)
class Interval:
    seconds: int


Expression = CronExpression | Interval


def parse_expression(text: str) -> Expression:
    """Parse ``spec.schedule``; refuses what would not fire as written."""
    stripped = text.strip()
    if stripped.startswith("@every"):
        match = _EVERY.match(stripped)
        if match is None:
            raise ScheduleExpressionError(
                f"{text!r} is not an interval: write '@every' and a whole number of s, m or h "
                "(e.g. '@every 30s')"
            )
        seconds = int(match[1]) * _UNIT_SECONDS[match[2]]
        if seconds < MIN_INTERVAL_SECONDS:
            raise ScheduleExpressionError(
                f"interval {seconds}s is under the minimum of {MIN_INTERVAL_SECONDS}s"
            )
        if seconds > MAX_INTERVAL_SECONDS:
            raise ScheduleExpressionError(f"interval {seconds}s is over a year")
        return Interval(seconds)
    fields = stripped.split()
    if len(fields) != 5:
        raise ScheduleExpressionError(
            f"{text!r} is not a 5-field cron expression (minute hour day month weekday) "
            "nor '@every N'"
        )
    try:
        probe = CronSim(" ".join(fields), datetime(2000, 1, 1))
        next(probe)
    except (CronSimError, StopIteration) as error:
        reason = str(error) or "it never matches"
        raise ScheduleExpressionError(
            f"{text!r} is not a valid cron expression: {reason}"
        ) from None
    return CronExpression(" ".join(fields))


def zone_named(name: str) -> ZoneInfo:
    """The IANA zone ``name``; refuses names that are paths or unknown."""
    if not name or name.startswith("/") or ".." in name or name != name.strip():
        raise TimeZoneError(f"{name!r} is not an IANA time zone name")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise TimeZoneError(
            f"unknown time zone {name!r} (IANA names such as 'Europe/Paris', 'UTC'; "
            f"tzdata {TZDATA_VERSION})"
        ) from None


def _instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The instant of a naive wall time in ``zone``: its first occurrence when it occurs
    twice, the transition (the next valid instant) when it does not exist."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first
    # in a gap: fold=1 reads it with the offset after the transition (an instant before
    # it), fold=0 with the one before (an instant after it); the transition lies between
    low = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    high = first
    if low > high:
        low, high = high, low
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(zone).replace(tzinfo=None) >= wall:
            high = middle
        else:
            low = middle
    return high.replace(microsecond=0)


def times_after(expression: Expression, zone: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """The nominal times strictly after ``after`` (aware), ascending, as UTC instants;
    unbounded: the caller stops."""
    if after.tzinfo is None:
        raise ValueError("after must be timezone-aware")
    if isinstance(expression, Interval):
        step = expression.seconds
        epoch = int(after.timestamp()) // step + 1
        while True:
            yield datetime.fromtimestamp(epoch * step, UTC)
            epoch += 1
    # a wall time of the first pass of a repeated hour maps to an instant before a later
    # ``after`` in its second pass: the filter below drops it, so each fires once
    start = after.astimezone(zone).replace(tzinfo=None)
    last = after.astimezone(UTC)
    for wall in CronSim(expression.text, start):
        instant = _instant(wall, zone)
        if instant > last:
            last = instant
            yield instant


def times_between(
    expression: Expression, zone: ZoneInfo, after: datetime, until: datetime, *, limit: int
) -> list[datetime]:
    """At most ``limit`` nominal times in ``(after, until]``, oldest first."""
    found: list[datetime] = []
    for instant in times_after(expression, zone, after):
        if instant > until or len(found) >= limit:
            break
        found.append(instant)
    return found


def count_between(expression: Expression, zone: ZoneInfo, after: datetime, until: datetime) -> int:
    """How many nominal times lie in ``(after, until]`` (intervals by arithmetic; cron by
    counting, which stops at 100,000)."""
    if until <= after:
        return 0
    if isinstance(expression, Interval):
        step = expression.seconds
        return int(until.timestamp()) // step - int(after.timestamp()) // step
    return len(times_between(expression, zone, after, until, limit=100_000))


def run_name(schedule_name: str, expression: Expression, zone: ZoneInfo, nominal: datetime) -> str:
    """The run a nominal time makes: the schedule's name and the time (its wall time in the
    zone for cron, with seconds only for a manual trigger's time; the UTC time with seconds
    for an interval)."""
    if isinstance(expression, Interval):
        return f"{schedule_name}-{nominal.astimezone(UTC):%Y%m%d%H%M%S}"
    wall = nominal.astimezone(zone)
    # a manual trigger's time has seconds; a cron time has none
    return f"{schedule_name}-{wall:%Y%m%d%H%M}" + (f"{wall:%S}" if wall.second else "")


def next_times(
    expression: Expression, zone: ZoneInfo, after: datetime, count: int = 3
) -> list[datetime]:
    """The next ``count`` nominal times after ``after`` (for status.nextFireTimes)."""
    found: list[datetime] = []
    for instant in times_after(expression, zone, after):
        found.append(instant)
        if len(found) >= count or len(found) >= _PROBE_LIMIT:
            break
    return found
