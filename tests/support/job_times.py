"""When the Jobs of a namespace ran, from their own times (a watch, so a Job deleted later
still counts), and how many of them ran at once: limits (maxParallelTasks, forEach's
maxParallel, Kueue's quota) checked from what the cluster did, not from what the operator
says."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar

from tests.plugins.operator import JobCreationLog, RunDriver
from tests.support.waiting import wait_until

Moment = TypeVar("Moment", datetime, float)


def most_at_once(intervals: Sequence[tuple[Moment, Moment]]) -> int:
    """The most half-open [start, end) intervals that hold at one instant (a Job counts from
    its creation until its completion; second resolution orders them conservatively)."""
    points = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = current = 0
    for _, change in points:  # at equal times the end (-1) sorts first
        current += change
        most = max(most, current)
    return most


class JobTimes(JobCreationLog):
    """Every Job's creation and completion times, as the Jobs themselves say, from a watch
    (kept when a Job is deleted later)."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.times: dict[str, tuple[str, datetime, datetime | None]] = {}
        self.objects: dict[str, Any] = {}
        super().__init__(api, namespace)

    def _record(self, job: Any) -> None:
        super()._record(job)
        run = (job.metadata.labels or {}).get("flowforge.io/run", "")
        completed = job.status.completion_time if job.status else None
        self.times[job.metadata.name] = (run, job.metadata.creation_timestamp, completed)
        self.objects[job.metadata.name] = job

    async def completed(self, jobs: dict[str, int], *, timeout: float = 30.0) -> None:
        """Wait until the watch has seen the Jobs of finished runs complete (``jobs``: how
        many each run has at least): it lags behind the runs' own status."""

        def seen() -> bool:
            ends = {
                run: [end for owner, _, end in self.times.values() if owner == run] for run in jobs
            }
            return all(
                len(ends[run]) >= count and None not in ends[run] for run, count in jobs.items()
            )

        await wait_until(seen, timeout=timeout, what=f"the Jobs' watch to see {jobs} complete")

    def pods_of(self, run: str, driver: RunDriver) -> list[tuple[str, str, str | None]]:
        """Each Pod of the run's Jobs: its name, phase and task container's finish (to tell
        why a span is longer than its task, when the count fails)."""
        found = []
        for name, (owner, _, _) in self.times.items():
            if owner != run:
                continue
            uid = self.objects[name].metadata.uid
            for pod in driver.core.list_namespaced_pod(
                driver.namespace, label_selector=f"batch.kubernetes.io/controller-uid={uid}"
            ).items:
                ended = [
                    str(status.state.terminated.finished_at)
                    for status in pod.status.container_statuses or []
                    if status.state.terminated is not None
                ]
                found.append((pod.metadata.name, str(pod.status.phase), ",".join(ended) or None))
        return found

    def intervals(self, run: str, driver: RunDriver) -> list[tuple[datetime, datetime]]:
        """Each Job's creation to its Pod's end: the success is recorded from the Pod, and
        the next Job created, about a second before the Job's own completionTime."""
        found = [
            (start, driver.pod_finished(self.objects[name]))
            for name, (owner, start, end) in self.times.items()
            if owner == run
        ]
        assert all(end is not None for _, end in found), f"a Job of {run} has not completed"
        return found
