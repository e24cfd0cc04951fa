"""What a schedule fires now: a pure function of its spec and what the store knows.

``decide(spec, view)`` is called under the schedule's lock, in the transaction that records
its outcome (``store/schedules.py``), with ``view.now`` read from the database's clock.

- **Due times** are the nominal times in ``(view.since, view.now]``; ``since`` is the newest
  time a pass has processed (the watermark), else the schedule's creation. The watermark
  moves to the newest due time, so a regular time is considered by one pass only.
- **Missed times** (downtime, ``suspend``): a time older than ``catchup.windowSeconds`` is
  missed (``OutsideWindow``); of those inside, ``Latest`` fires the newest (the rest
  ``Superseded``), ``All`` fires them oldest first, at most ``MAX_CATCHUP`` (the older rest
  ``TooMany``, which the operator reports as a Warning Event ``TooManyMissedSchedules``).
  While suspended nothing is decided and the watermark stays: resuming catches up.
- **Overlap** against the schedule's runs that are not final (a rolling-back run is active):
  ``Allow`` fires anyway; ``Skip`` does not (``Overlap``); ``Queue`` keeps one time waiting
  (further ones ``Overlap``) and fires it when nothing is active; ``Replace`` asks the active
  runs to cancel, keeps the newest time waiting (an older waiting one ``Replaced``) and
  fires it once their rollback has settled. A manual trigger obeys the same policy.
- **Backfills** fire every time in ``[from, to]`` (not after now) that no run was made for,
  oldest first, at most ``MAX_CATCHUP`` each, whatever the overlap policy; each is processed
  once, by id.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import Counter, deque
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from flowforge.domain.schedule import CatchupMode, OverlapPolicy, ScheduleSpec
from flowforge.domain.schedule_times import (
    Expression,
    Interval,
    count_between,
    parse_expression,
    times_after,
    times_between,
    zone_named,
)

MAX_CATCHUP = 100


class MissedReason(enum.StrEnum):
    OVERLAP = "Overlap"
    OUTSIDE_WINDOW = "OutsideWindow"
    SUPERSEDED = "Superseded"
    TOO_MANY = "TooMany"
    REPLACED = "Replaced"


@dataclasses.dataclass(frozen=True)
class ScheduleView:
    """What the store knows of one schedule when a pass decides."""

    now: datetime
    since: datetime
    active: tuple[str, ...] = ()
    queued: datetime | None = None
    processed_backfills: frozenset[str] = frozenset()
    fired: frozenset[datetime] = frozenset()  # the fired times inside the backfills' ranges
    trigger: datetime | None = None  # a manual trigger asked for at this instant


@dataclasses.dataclass(frozen=True)
class Fire:
    nominal: datetime
    backfill: str | None = None
    manual: bool = False


@dataclasses.dataclass(frozen=True)
class FireDecision:
    fire: tuple[Fire, ...] = ()
    missed: Mapping[MissedReason, int] = dataclasses.field(default_factory=dict)
    queued: datetime | None = None
    cancel: tuple[str, ...] = ()
    watermark: datetime | None = None
    backfills_done: tuple[str, ...] = ()
    too_many: int = 0  # times dropped beyond MAX_CATCHUP (a Warning Event)

    @property
    def changed(self) -> bool:
        return bool(self.fire or self.missed or self.cancel or self.backfills_done)


def _newest_between(
    expression: Expression, zone: ZoneInfo, after: datetime, until: datetime, keep: int
) -> tuple[int, list[datetime]]:
    """How many times lie in ``(after, until]`` and the newest ``keep`` of them."""
    if until <= after:
        return 0, []
    if isinstance(expression, Interval):
        total = count_between(expression, zone, after, until)
        step = expression.seconds
        last = int(until.timestamp()) // step * step
        shown = min(total, keep)
        return total, [
            datetime.fromtimestamp(last - step * (shown - 1 - index), UTC) for index in range(shown)
        ]
    window: deque[datetime] = deque(maxlen=keep)
    total = 0
    for instant in times_after(expression, zone, after):
        if instant > until or total >= 100_000:
            break
        window.append(instant)
        total += 1
    return total, list(window)


def _due(
    spec: ScheduleSpec, view: ScheduleView, missed: Counter[MissedReason]
) -> tuple[list[datetime], datetime, int]:
    """The regular times to consider (oldest first), the new watermark, the times dropped
    beyond ``MAX_CATCHUP``."""
    expression = parse_expression(spec.schedule)
    zone = zone_named(spec.time_zone)
    total, newest = _newest_between(expression, zone, view.since, view.now, MAX_CATCHUP)
    watermark = newest[-1] if newest else view.since
    window_start = view.now - timedelta(seconds=spec.catchup.window_seconds)
    outside = count_between(expression, zone, view.since, window_start)
    if outside:
        missed[MissedReason.OUTSIDE_WINDOW] += outside
    eligible = [instant for instant in newest if instant > window_start]
    in_window = total - outside
    too_many = 0
    if spec.catchup.mode is CatchupMode.LATEST:
        chosen = eligible[-1:]
        if in_window > len(chosen):
            missed[MissedReason.SUPERSEDED] += in_window - len(chosen)
    else:
        chosen = eligible
        too_many = in_window - len(chosen)
        if too_many:
            missed[MissedReason.TOO_MANY] += too_many
    return chosen, watermark, too_many


def _backfills(
    spec: ScheduleSpec, view: ScheduleView, missed: Counter[MissedReason]
) -> tuple[list[Fire], list[str], int]:
    expression = parse_expression(spec.schedule)
    zone = zone_named(spec.time_zone)
    fires: list[Fire] = []
    done: list[str] = []
    too_many = 0
    for backfill in spec.backfills:
        if backfill.id in view.processed_backfills:
            continue
        done.append(backfill.id)
        until = min(backfill.to, view.now)
        start = backfill.from_ - timedelta(microseconds=1)
        times = times_between(expression, zone, start, until, limit=MAX_CATCHUP + 1)
        if len(times) > MAX_CATCHUP:
            dropped = count_between(expression, zone, start, until) - MAX_CATCHUP
            too_many += dropped
            missed[MissedReason.TOO_MANY] += dropped
            times = times[:MAX_CATCHUP]
        fires.extend(
            Fire(instant, backfill=backfill.id) for instant in times if instant not in view.fired
        )
    return fires, done, too_many


def decide(spec: ScheduleSpec, view: ScheduleView) -> FireDecision:
    """What to fire, queue, cancel and count missed now (see the module's docstring)."""
    if spec.suspend:
        return FireDecision(queued=view.queued, watermark=view.since)
    missed: Counter[MissedReason] = Counter()
    chosen, watermark, too_many = _due(spec, view, missed)
    candidates = [Fire(instant) for instant in chosen]
    if view.trigger is not None:
        candidates.append(Fire(view.trigger, manual=True))
    policy = spec.overlap_policy
    if policy is OverlapPolicy.REPLACE and len(candidates) > 1:
        missed[MissedReason.REPLACED] += len(candidates) - 1
        candidates = candidates[-1:]
    active = len(view.active)
    queued = view.queued
    fire: list[Fire] = []
    if queued is not None and active == 0:
        fire.append(Fire(queued))
        queued = None
        active += 1
    for candidate in candidates:
        if policy is OverlapPolicy.ALLOW or active == 0:
            fire.append(candidate)
            active += 1
        elif policy is OverlapPolicy.SKIP:
            missed[MissedReason.OVERLAP] += 1
        elif policy is OverlapPolicy.QUEUE:
            if queued is None:
                queued = candidate.nominal
            else:
                missed[MissedReason.OVERLAP] += 1
        else:  # Replace
            if queued is not None:
                missed[MissedReason.REPLACED] += 1
            queued = candidate.nominal
    cancel: tuple[str, ...] = ()
    if policy is OverlapPolicy.REPLACE and queued is not None:
        cancel = view.active
    backfill_fires, done, backfill_too_many = _backfills(spec, view, missed)
    return FireDecision(
        fire=tuple(fire) + tuple(backfill_fires),
        missed=dict(missed),
        queued=queued,
        cancel=cancel,
        watermark=watermark,
        backfills_done=tuple(done),
        too_many=too_many + backfill_too_many,
    )
