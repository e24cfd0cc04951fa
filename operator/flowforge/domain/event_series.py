"""Which Events of a run are posted one by one, and which fold into one Event that counts
them, the way the Kubernetes event recorder aggregates similar Events.

A big run would otherwise write an Event per task start and per success: 20,000 writes for
10,000 tasks, each a write to etcd that nobody reads one by one. Events of one run with the
same reason and type are *similar*. The first ``SIMILAR_BEFORE_SERIES`` of a window are posted
as they are; the rest of the window fold into one series Event per reason, whose count and
message ("(combined from similar events): " and the newest message) the notifier writes at
most once per flush interval. Warnings are never folded: each says what went wrong.
The store's history keeps every step; Events are for people (``kubectl describe``).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

SIMILAR_BEFORE_SERIES = 10
WINDOW_SECONDS = 600.0
COMBINED_PREFIX = "(combined from similar events): "
_REMEMBERED_KEYS = 10_000


@dataclasses.dataclass
class _Window:
    started: float
    alone: int = 0
    folded: int = 0
    written: int = 0  # the count the series Event has in the apiserver (0: not created)
    message: str = ""
    serial: int = 0  # which window of the key this is: part of the series Event's name


@dataclasses.dataclass(frozen=True)
class SeriesUpdate:
    """What the series Event of (run, reason) should say now."""

    name_suffix: str
    reason: str
    count: int
    message: str
    exists: bool  # written before: update it, else create it


class EventCorrelator:
    """Counts similar Events per run and reason; bounded (the oldest keys are forgotten)."""

    def __init__(
        self,
        *,
        similar_before_series: int = SIMILAR_BEFORE_SERIES,
        window_seconds: float = WINDOW_SECONDS,
    ) -> None:
        self._similar_before_series = similar_before_series
        self._window_seconds = window_seconds
        self._windows: OrderedDict[tuple[str, str], _Window] = OrderedDict()

    def observe(
        self, *, run_uid: str, reason: str, warning: bool, message: str, now: float
    ) -> bool:
        """Whether the Event is posted on its own (True) or folded into the series (False)."""
        if warning:
            return True
        key = (run_uid, reason)
        window = self._windows.get(key)
        if window is None or now - window.started > self._window_seconds:
            serial = 0 if window is None else window.serial + 1
            window = _Window(started=now, serial=serial)
            self._windows[key] = window
            if len(self._windows) > _REMEMBERED_KEYS:
                self._windows.popitem(last=False)
        self._windows.move_to_end(key)
        if window.alone < self._similar_before_series:
            window.alone += 1
            return True
        window.folded += 1
        window.message = message
        return False

    def pending(self, *, run_uid: str, reason: str) -> SeriesUpdate | None:
        """The series Event's new count and message, when it has folded Events not yet
        written (None: nothing to write)."""
        window = self._windows.get((run_uid, reason))
        if window is None or window.folded == window.written:
            return None
        return SeriesUpdate(
            name_suffix=f"{reason.lower()}.{window.serial}",
            reason=reason,
            count=window.folded,
            message=COMBINED_PREFIX + window.message,
            exists=window.written > 0,
        )

    def written(self, *, run_uid: str, update: SeriesUpdate) -> None:
        """The series Event now says ``update``."""
        window = self._windows.get((run_uid, update.reason))
        if window is not None and update.name_suffix.endswith(f".{window.serial}"):
            window.written = max(window.written, update.count)
