"""An in-memory fake of the operator's Kubernetes port (``flowforge.operator.kubeport``).

For engine-logic tests only: it keeps Jobs, WorkflowRuns, status patches and Events in
dicts and lists, answers as the apiserver does for the cases the engine relies on
(AlreadyExists, NotFound), and lets a test finish a Job the way the Job controller would.
It never stands in for the cluster tests, which run the same engine against a real
kube-apiserver.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from flowforge.domain.execution import TerminatedContainer

Hook = Callable[[Mapping[str, Any]], Awaitable[None]]


@dataclasses.dataclass
class PostedEvent:
    namespace: str
    run_name: str
    reason: str
    message: str
    warning: bool


class FakeKube:
    def __init__(self) -> None:
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.runs: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[PostedEvent] = []
        self.created: list[str] = []  # Job names in the order they were created
        self.deleted: list[str] = []
        self.before_create: Hook | None = None  # runs before a Job is stored
        self.fail_creates = 0  # that many creations raise, as a crash or outage would

    # the port

    async def create_job(self, manifest: Mapping[str, Any]) -> bool:
        if self.before_create is not None:
            await self.before_create(manifest)
        if self.fail_creates:
            self.fail_creates -= 1
            raise ConnectionError("the apiserver is unreachable")
        key = (manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        if key in self.jobs:
            return False
        self.jobs[key] = copy.deepcopy(dict(manifest)) | {"status": {}}
        self.created.append(key[1])
        return True

    async def delete_job(self, *, namespace: str, name: str) -> bool:
        if self.jobs.pop((namespace, name), None) is None:
            return False
        self.deleted.append(name)
        return True

    async def read_job(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        job = self.jobs.get((namespace, name))
        return None if job is None else copy.deepcopy(job)

    async def list_jobs(
        self, *, namespace: str | None, label_selector: str
    ) -> list[dict[str, Any]]:
        label, _, value = label_selector.partition("=")
        return [
            copy.deepcopy(job)
            for (job_namespace, _), job in self.jobs.items()
            if namespace in (None, job_namespace)
            and job["metadata"].get("labels", {}).get(label) == value
        ]

    async def job_termination(self, *, namespace: str, job_name: str) -> TerminatedContainer | None:
        return None

    async def read_run(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        run = self.runs.get((namespace, name))
        return None if run is None else copy.deepcopy(run)

    async def list_runs(self, *, namespace: str | None) -> list[dict[str, Any]]:
        return [copy.deepcopy(run) for (ns, _), run in self.runs.items() if namespace in (None, ns)]

    async def patch_run_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any]
    ) -> bool:
        run = self.runs.get((namespace, name))
        if run is None:
            return False
        run["status"] = {**run.get("status", {}), **status}
        return True

    async def json_patch_run(
        self, *, namespace: str, name: str, operations: Sequence[Mapping[str, Any]]
    ) -> bool:
        """The JSON patch operations the engine sends on a run's finalizers: test, add
        (``-`` appends) and remove, on paths under ``/metadata``."""
        run = self.runs.get((namespace, name))
        if run is None:
            return False
        patched = copy.deepcopy(run)
        for operation in operations:
            *parents, leaf = operation["path"].strip("/").split("/")
            target: Any = patched
            for part in parents:
                target = target[int(part)] if isinstance(target, list) else target[part]
            if operation["op"] == "test":
                current = target[int(leaf)] if isinstance(target, list) else target.get(leaf)
                if current != operation["value"]:
                    raise AssertionError(f"JSON patch test failed: {operation}")
            elif operation["op"] == "add" and isinstance(target, list):
                target.insert(len(target) if leaf == "-" else int(leaf), operation["value"])
            elif operation["op"] == "add":
                target[leaf] = copy.deepcopy(operation["value"])
            elif operation["op"] == "remove":
                del target[int(leaf) if isinstance(target, list) else leaf]
            else:
                raise AssertionError(f"unsupported JSON patch operation {operation}")
        self.runs[(namespace, name)] = patched
        if patched["metadata"].get("deletionTimestamp") and not patched["metadata"].get(
            "finalizers"
        ):
            del self.runs[(namespace, name)]  # the apiserver lets it go
        return True

    async def patch_definition_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any]
    ) -> bool:
        return False

    async def post_run_event(
        self,
        *,
        namespace: str,
        run_name: str,
        run_uid: str,
        reason: str,
        message: str,
        warning: bool = False,
    ) -> None:
        self.events.append(PostedEvent(namespace, run_name, reason, message, warning))

    # what the Job controller would do

    def finish(self, name: str, *, succeeded: bool) -> dict[str, Any]:
        """Mark the Job called ``name`` Complete or Failed; returns it as a watch would."""
        job = next(job for (_, job_name), job in self.jobs.items() if job_name == name)
        condition = "Complete" if succeeded else "Failed"
        job["status"] = {
            "startTime": "2026-12-01T10:00:00Z",
            "completionTime": "2026-12-01T10:00:03Z" if succeeded else None,
            "conditions": [
                {
                    "type": condition,
                    "status": "True",
                    "reason": "Done",
                    "lastTransitionTime": "2026-12-01T10:00:03Z",
                }
            ],
        }
        return copy.deepcopy(job)

    def active(self) -> list[str]:
        """Names of Jobs that exist and have not finished, in creation order."""
        return [
            name
            for name in self.created
            if any(
                job_name == name and not job["status"] for (_, job_name), job in self.jobs.items()
            )
        ]

    def reasons(self) -> list[str]:
        return [event.reason for event in self.events]
