"""The core/v1 Events the operator writes on a WorkflowRun, built in one place.

A ``RunEvent`` is what the engine's port is asked to post: on which run, which ``Notice``.
``event_body`` turns it into the Event object (a single Event with a generated name, or the
named Event of a series that stands for ``count`` similar ones, ``domain/event_series.py``);
``series_change`` is the patch that brings a series Event up to date. Pure: no client.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from flowforge.domain.api import API_VERSION, RUN_KIND
from flowforge.domain.decision import Notice

COMPONENT = "flowforge-operator"
MESSAGE_LIMIT = 1000  # characters of an Event's message; the rest is cut
NAME_PREFIX_LIMIT = 200  # characters of the run's name in an Event's name


@dataclasses.dataclass(frozen=True)
class RunEvent:
    namespace: str
    run_name: str
    run_uid: str
    notice: Notice

    @property
    def reason(self) -> str:
        return self.notice.reason

    @property
    def message(self) -> str:
        return self.notice.message

    @property
    def warning(self) -> bool:
        return self.notice.warning


def timestamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def series_name(event: RunEvent, *, suffix: str) -> str:
    """The name of the run's series Event of ``suffix`` (the series' reason and kind)."""
    return f"{event.run_name[:NAME_PREFIX_LIMIT]}.{event.run_uid[:8]}.{suffix}"


def series_change(*, message: str, count: int, now: datetime) -> dict[str, Any]:
    """What a newer write of a series Event changes: its message, count and last time."""
    return {"message": message[:MESSAGE_LIMIT], "count": count, "lastTimestamp": timestamp(now)}


def event_body(
    event: RunEvent, *, now: datetime, name: str | None = None, count: int = 1
) -> dict[str, Any]:
    """The Event about the run: named ``name`` when it is a series' (counting ``count``
    Events), else with a name the apiserver generates from the run's."""
    metadata = (
        {"name": name, "namespace": event.namespace}
        if name is not None
        else {
            "generateName": f"{event.run_name[:NAME_PREFIX_LIMIT]}.",
            "namespace": event.namespace,
        }
    )
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": metadata,
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": RUN_KIND,
            "name": event.run_name,
            "namespace": event.namespace,
            "uid": event.run_uid,
        },
        "reason": event.reason,
        "type": "Warning" if event.warning else "Normal",
        "source": {"component": COMPONENT},
        "firstTimestamp": timestamp(now),
        **series_change(message=event.message, count=count, now=now),
    }
