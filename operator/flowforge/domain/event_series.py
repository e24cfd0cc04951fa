"""Which Events of a run are posted one by one, and which fold into one Event that counts
them, the way the Kubernetes event recorder aggregates similar Events.

A big run would otherwise write an Event per task start and per success: 20,000 writes for
10,000 tasks, each a write to etcd that nobody reads one by one. Events of one run with the
same reason and type are *similar*. The first ``SIMILAR_BEFORE_SERIES`` of a window are posted
as they are; the rest of the window fold into one series Event per reason, whose count and
message ("(combined from similar events): " and the newest message) the notifier writes at
most once per flush interval. Warnings are never folded: each says what went wrong.
The store's history keeps every step; Events are for people (``kubectl describe``).

What is counted is kept per run while the run goes on: a finished run's windows are dropped
(``forget_run``) once their series Event says all they folded, and the oldest runs go first
beyond ``_REMEMBERED_RUNS``.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

SIMILAR_BEFORE_SERIES = 10
WINDOW_SECONDS = 600.0
COMBINED_PREFIX = "(combined from similar events): "
_REMEMBERED_RUNS = 2_000


@dataclasses.dataclass(slots=True)
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
    """Counts similar Events per run and reason; bounded (the oldest runs are forgotten)."""

    def __init__(
        self,
        *,
        similar_before_series: int = SIMILAR_BEFORE_SERIES,
        window_seconds: float = WINDOW_SECONDS,
        remembered_runs: int = _REMEMBERED_RUNS,
    ) -> None:
        self._similar_before_series = similar_before_series
        self._window_seconds = window_seconds
        self._remembered_runs = remembered_runs
        # run uid -> reason -> window; runs in the order they last posted
        self._runs: OrderedDict[str, dict[str, _Window]] = OrderedDict()
        self._finished: set[str] = set()  # forgotten runs whose series are not all written

    def __len__(self) -> int:
        """How many windows are kept (all runs, all reasons)."""
        return sum(len(windows) for windows in self._runs.values())

    def observe(
        self, *, run_uid: str, reason: str, warning: bool, message: str, now: float
    ) -> bool:
        """Whether the Event is posted on its own (True) or folded into the series (False)."""
        if warning:
            return True
        windows = self._runs.get(run_uid)
        if windows is None:
            windows = self._runs[run_uid] = {}
            if len(self._runs) > self._remembered_runs:
                oldest, _ = self._runs.popitem(last=False)
                self._finished.discard(oldest)
        self._runs.move_to_end(run_uid)
        window = windows.get(reason)
        if window is None or now - window.started > self._window_seconds:
            serial = 0 if window is None else window.serial + 1
            window = windows[reason] = _Window(started=now, serial=serial)
        if window.alone < self._similar_before_series:
            window.alone += 1
            return True
        window.folded += 1
        window.message = message
        return False

    def pending(self, *, run_uid: str, reason: str) -> SeriesUpdate | None:
        """The series Event's new count and message, when it has folded Events not yet
        written (None: nothing to write)."""
        window = self._runs.get(run_uid, {}).get(reason)
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
        window = self._runs.get(run_uid, {}).get(update.reason)
        if window is not None and update.name_suffix.endswith(f".{window.serial}"):
            window.written = max(window.written, update.count)
        if run_uid in self._finished:
            self._drop_written(run_uid)

    def forget_run(self, run_uid: str) -> None:
        """The run finished: its windows go, each once its series Event is written."""
        self._finished.add(run_uid)
        self._drop_written(run_uid)

    def _drop_written(self, run_uid: str) -> None:
        windows = self._runs.get(run_uid, {})
        for reason in [r for r, window in windows.items() if window.folded == window.written]:
            del windows[reason]
        if not windows:
            self._runs.pop(run_uid, None)
            self._finished.discard(run_uid)
