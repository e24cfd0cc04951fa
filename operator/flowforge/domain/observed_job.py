"""What an observed Job of a running attempt means: the one rule the Job watch and the
reconciler's pass both apply (``operator/engine.py::on_job_event``,
``operator/reconciler.py``).

Whose Job it is comes first and is not decided here: a Job that is not the run's own (another
namespace, another uid: ``operator/launcher.py``) is a forgery and counts as no Job at all.
For the run's own Job, or its absence:

- ``FINISHED``: its status holds an outcome (complete, failed, deadline exceeded): record it;
- ``VANISHED``: the Job the run recorded is gone (deleted, or a watch's DELETED event
  without an outcome): a lost attempt, unless the run itself is gone (``run.run_gone``);
- ``ADMISSION``: a Kueue Job that has not finished: admitted, evicted or still waiting;
- ``RUNNING``: nothing to record; the watchdog (``operator/watchdog.py``) looks at its
  pending timeout.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from flowforge.domain.execution import job_outcome
from flowforge.domain.kueue import job_admission


class JobMeaning(StrEnum):
    FINISHED = "finished"
    VANISHED = "vanished"
    ADMISSION = "admission"
    RUNNING = "running"


def job_meaning(job: Mapping[str, Any] | None, *, deleted: bool = False) -> JobMeaning:
    """What the run's own Job (None: none is there) means for its attempt; ``deleted``: the
    body is the last one a watch saw before the Job went."""
    if job is None:
        return JobMeaning.VANISHED
    if job_outcome(job.get("status") or {}) is not None:
        return JobMeaning.FINISHED
    if deleted:
        return JobMeaning.VANISHED
    if job_admission(job) is not None:
        return JobMeaning.ADMISSION
    return JobMeaning.RUNNING
