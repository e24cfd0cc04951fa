"""An in-memory fake of the operator's Kubernetes port (``flowforge.operator.kubeport``).

For engine-logic tests only: it keeps Jobs, ConfigMaps, WorkflowRuns, status patches and
Events in dicts and lists, answers as the apiserver does for the cases the engine relies on
(AlreadyExists, NotFound, a failed uid precondition), gives every Job a uid, and lets a test
finish a Job the way the Job controller would (its Pod, owned by the Job, tells the exit code)
or forge Jobs and Pods the way an attacker would.
It never stands in for the cluster tests, which run the same engine against a real
kube-apiserver.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from flowforge.domain.execution import TerminatedContainer
from flowforge.kube.config_map import ConfigMapFound
from flowforge.kube.events import RunEvent
from flowforge.kube.jobs import CreatedJob, JobIdentity
from flowforge.kube.pages import ListPage, PageTooLarge

Hook = Callable[[Mapping[str, Any]], Awaitable[None]]


@dataclasses.dataclass(frozen=True)
class ListCall:
    kind: str  # jobs | runs
    limit: int
    continue_token: str | None
    field_selector: str | None = None
    returned: int = 0  # the objects on the page (none when it was over its budget)


class FakeKube:
    def __init__(self) -> None:
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.config_maps: dict[tuple[str, str], dict[str, Any]] = {}
        self.config_map_calls = 0  # creations asked for, AlreadyExists included
        self.config_map_reads = 0  # reads of a ConfigMap's uid
        self.runs: dict[tuple[str, str], dict[str, Any]] = {}
        self.namespaces: dict[str, str | None] = {}  # name -> uid (None: there is none)
        self.namespace_reads = 0
        self.policies: dict[str, list[dict[str, Any]]] = {}
        self.actions: dict[tuple[str, str], dict[str, Any]] = {}  # WorkflowRunActions
        self.events: list[RunEvent] = []
        self.event_series: dict[tuple[str, str], tuple[str, str, int]] = {}
        self.created: list[str] = []  # Job names in the order they were created
        self.deleted: list[str] = []
        self.pods: list[dict[str, Any]] = []
        self.lists: list[ListCall] = []  # every LIST, paged as the apiserver pages it
        self.job_reads = 0  # GETs of one Job
        self.status_patches: list[str] = []  # the runs whose status was patched, in order
        self.before_create: Hook | None = None  # runs before a Job is stored
        self.before_list_jobs: Callable[[], Awaitable[None]] | None = None  # before a LIST
        self.definition_status_patches: list[tuple[str, str, dict[str, Any]]] = []
        self.fail_creates = 0  # that many creations raise, as a crash or outage would
        # what a creation raises, if anything, given the manifest (a quota, an invalid Job)
        self.create_error: Callable[[Mapping[str, Any]], Exception | None] | None = None

    # the port

    async def create_job(self, manifest: Mapping[str, Any]) -> CreatedJob:
        if self.before_create is not None:
            await self.before_create(manifest)
        if self.fail_creates:
            self.fail_creates -= 1
            raise ConnectionError("the apiserver is unreachable")
        error = None if self.create_error is None else self.create_error(manifest)
        if error is not None:
            raise error
        key = (manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        existing = self.jobs.get(key)
        if existing is not None:
            return _created(existing, created=False)
        job = copy.deepcopy(dict(manifest)) | {"status": {}}
        job["metadata"]["uid"] = str(uuid.uuid4())
        job["metadata"]["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.jobs[key] = job
        self.created.append(key[1])
        return _created(job, created=True)

    async def create_config_map(self, manifest: Mapping[str, Any]) -> ConfigMapFound:
        self.config_map_calls += 1
        await asyncio.sleep(0)  # concurrent creations overlap, as over the network
        key = (manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        if key in self.config_maps:
            return ConfigMapFound(body=copy.deepcopy(self.config_maps[key]), created=False)
        made = copy.deepcopy(dict(manifest))
        made["metadata"]["uid"] = str(uuid.uuid4())
        self.config_maps[key] = made
        return ConfigMapFound(body=copy.deepcopy(made), created=True)

    async def config_map_uid(self, *, namespace: str, name: str) -> str | None:
        self.config_map_reads += 1
        found = self.config_maps.get((namespace, name))
        return None if found is None else found["metadata"].get("uid")

    async def delete_job(self, *, namespace: str, name: str, uid: str | None = None) -> bool:
        job = self.jobs.get((namespace, name))
        if job is None or (uid is not None and job["metadata"]["uid"] != uid):
            return False
        del self.jobs[(namespace, name)]
        self.deleted.append(name)
        return True

    async def namespace_uid(self, namespace: str) -> str | None:
        """Each namespace's uid (a test deletes and re-creates one by changing it)."""
        self.namespace_reads += 1
        return self.namespaces.setdefault(namespace, str(uuid.uuid4()))

    async def read_job(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        self.job_reads += 1
        job = self.jobs.get((namespace, name))
        return None if job is None else copy.deepcopy(job)

    async def list_jobs(
        self,
        *,
        namespace: str | None,
        label_selector: str,
        limit: int,
        continue_token: str | None,
        max_bytes: int,
        field_selector: str | None = None,
    ) -> ListPage:
        if self.before_list_jobs is not None:
            await self.before_list_jobs()
        label, _, value = label_selector.partition("=")
        matching = [
            job
            for (job_namespace, _), job in sorted(self.jobs.items())
            if namespace in (None, job_namespace)
            and job["metadata"].get("labels", {}).get(label) == value
            and _fields_match(job, field_selector)
        ]
        return self._page(
            "jobs",
            matching,
            limit=limit,
            continue_token=continue_token,
            max_bytes=max_bytes,
            field_selector=field_selector,
        )

    def listed_jobs(self) -> int:
        """How many Job objects the LISTs so far returned."""
        return sum(call.returned for call in self.lists if call.kind == "jobs")

    async def job_termination(
        self, *, namespace: str, job_name: str, job_uid: str
    ) -> TerminatedContainer | None:
        """As the client: the newest Pod labelled for the Job that the Job controls."""
        for pod in reversed(self.pods):  # in creation order, the newest last
            metadata = pod["metadata"]
            if metadata["namespace"] != namespace or metadata["labels"].get("job-name") != job_name:
                continue
            if not any(
                owner["uid"] == job_uid and owner.get("controller") is True
                for owner in metadata.get("ownerReferences") or []
            ):
                continue
            if "exitCode" in pod:
                return TerminatedContainer(exit_code=pod["exitCode"], reason="Error")
        return None

    async def job_pods(
        self, *, namespace: str, job_name: str, job_uid: str
    ) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(pod)
            for pod in self.pods
            if pod["metadata"]["namespace"] == namespace
            and pod["metadata"]["labels"].get("job-name") == job_name
            and any(
                owner["uid"] == job_uid and owner.get("controller") is True
                for owner in pod["metadata"].get("ownerReferences") or []
            )
        ]

    async def read_run(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        run = self.runs.get((namespace, name))
        return None if run is None else copy.deepcopy(run)

    async def list_runs(
        self, *, namespace: str | None, limit: int, continue_token: str | None, max_bytes: int
    ) -> ListPage:
        matching = [run for (ns, _), run in sorted(self.runs.items()) if namespace in (None, ns)]
        return self._page(
            "runs", matching, limit=limit, continue_token=continue_token, max_bytes=max_bytes
        )

    def _page(
        self,
        kind: str,
        items: list[dict[str, Any]],
        *,
        limit: int,
        continue_token: str | None,
        max_bytes: int,
        field_selector: str | None = None,
    ) -> ListPage:
        """As the apiserver pages a LIST: at most ``limit`` items, and a token for the rest;
        as the client reads it: not past ``max_bytes`` of its JSON."""
        start = int(continue_token or 0)
        end = start + limit
        page = [copy.deepcopy(item) for item in items[start:end]]
        size = len(json.dumps(page, default=str))
        read = size <= max_bytes
        self.lists.append(ListCall(kind, limit, continue_token, field_selector, len(page) * read))
        if not read:
            raise PageTooLarge(max_bytes=max_bytes, length=None)
        token = str(end) if end < len(items) else None
        return ListPage(items=page, continue_token=token, size=size)

    async def list_policies(self, *, namespace: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(policy) for policy in self.policies.get(namespace, [])]

    async def patch_run_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any]
    ) -> bool:
        run = self.runs.get((namespace, name))
        if run is None:
            return False
        run["status"] = {**run.get("status", {}), **status}
        self.status_patches.append(name)
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

    async def patch_action_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any]
    ) -> bool:
        action = self.actions.get((namespace, name))
        if action is None:
            return False
        action["status"] = {**(action.get("status") or {}), **status}
        return True

    async def patch_definition_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any]
    ) -> bool:
        self.definition_status_patches.append((namespace, name, copy.deepcopy(dict(status))))
        return True

    async def post_run_event(self, event: RunEvent) -> None:
        self.events.append(event)

    async def write_run_event_series(
        self, event: RunEvent, *, name: str, count: int, exists: bool
    ) -> None:
        self.event_series[(event.namespace, name)] = (event.reason, event.message, count)

    # what the Job controller would do

    def finish(
        self, name: str, *, succeeded: bool, exit_code: int | None = None, namespace: str = ""
    ) -> dict[str, Any]:
        """Mark the Job called ``name`` Complete or Failed; returns it as a watch would. With
        ``exit_code``, a Pod of the Job (controlled by it) ended with that code."""
        job = next(
            job
            for (job_namespace, job_name), job in self.jobs.items()
            if job_name == name and namespace in ("", job_namespace)
        )
        condition = "Complete" if succeeded else "Failed"
        job["status"] = {
            "succeeded" if succeeded else "failed": 1,  # the Pod counts, as the controller's
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
        if exit_code is not None:
            metadata = job["metadata"]
            owner = {"kind": "Job", "name": name, "uid": metadata["uid"], "controller": True}
            self.add_pod(metadata["namespace"], job_name=name, exit_code=exit_code, owner=owner)
        return copy.deepcopy(job)

    def add_pod(
        self,
        namespace: str,
        *,
        job_name: str,
        exit_code: int,
        owner: Mapping[str, Any] | None = None,
    ) -> None:
        """A Pod labelled ``job-name=job_name`` whose task container ended with
        ``exit_code``; ``owner`` its controller ownerReference (None: a Pod anyone made)."""
        self.pods.append(
            {
                "metadata": {
                    "namespace": namespace,
                    "name": f"{job_name}-{uuid.uuid4().hex[:5]}",
                    "labels": {"job-name": job_name},
                    "ownerReferences": [dict(owner)] if owner else [],
                },
                "exitCode": exit_code,
            }
        )

    def add_waiting_pod(self, job_name: str, *, status: Mapping[str, Any]) -> None:
        """A Pod of the Job (controlled by it) that has not started, with ``status``."""
        job = next(job for (_, name), job in self.jobs.items() if name == job_name)
        metadata = job["metadata"]
        self.pods.append(
            {
                "metadata": {
                    "namespace": metadata["namespace"],
                    "name": f"{job_name}-{uuid.uuid4().hex[:5]}",
                    "labels": {"job-name": job_name},
                    "ownerReferences": [
                        {
                            "kind": "Job",
                            "name": job_name,
                            "uid": metadata["uid"],
                            "controller": True,
                        }
                    ],
                },
                "status": dict(status),
            }
        )

    def job_pod(
        self,
        job_name: str,
        *,
        phase: str = "Succeeded",
        exit_code: int = 0,
        tracked: bool = True,
        namespace: str = "",
    ) -> dict[str, Any]:
        """A Pod of the Job called ``job_name`` as the Job controller makes it (its controller
        ownerReference, its ``batch.kubernetes.io/controller-uid`` label, the tracking
        finalizer unless ``tracked`` is False) and as a watch shows it once the task
        container ended with ``exit_code`` (``phase``). ``namespace``: the Job's, unless
        given (as an attacker would, with the Job's references copied)."""
        job = next(job for (_, name), job in self.jobs.items() if name == job_name)
        metadata = job["metadata"]
        uid = metadata["uid"]
        labels = dict(job["spec"]["template"]["metadata"]["labels"])
        labels |= {"batch.kubernetes.io/controller-uid": uid, "job-name": job_name}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "namespace": namespace or metadata["namespace"],
                "name": f"{job_name}-{uuid.uuid4().hex[:5]}",
                "uid": str(uuid.uuid4()),
                "labels": labels,
                "finalizers": ["batch.kubernetes.io/job-tracking"] if tracked else [],
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": job_name,
                        "uid": uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "status": {
                "phase": phase,
                "containerStatuses": [
                    {
                        "name": "task",
                        "state": {
                            "terminated": {
                                "exitCode": exit_code,
                                "reason": "Completed" if exit_code == 0 else "Error",
                                "startedAt": "2026-12-01T10:00:00Z",
                                "finishedAt": "2026-12-01T10:00:02Z",
                            }
                        },
                    }
                ],
            },
        }

    def age_job(self, job_name: str, *, seconds: float) -> None:
        """Make the Job look created ``seconds`` ago."""
        job = next(job for (_, name), job in self.jobs.items() if name == job_name)
        moment = datetime.now(UTC) - timedelta(seconds=seconds)
        job["metadata"]["creationTimestamp"] = moment.strftime("%Y-%m-%dT%H:%M:%SZ")

    def copy_job(self, name: str, *, namespace: str) -> dict[str, Any]:
        """What an attacker does: a Job with a run's Job's labels, annotations and owner
        references (``name`` is the original's), created in ``namespace`` with a uid of its
        own. Returns it, unfinished, as the watch would."""
        original = next(job for (_, job_name), job in self.jobs.items() if job_name == name)
        forged = copy.deepcopy(original) | {"status": {}}
        forged["metadata"]["namespace"] = namespace
        forged["metadata"]["uid"] = str(uuid.uuid4())
        self.jobs[(namespace, name)] = forged
        return copy.deepcopy(forged)

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


def _fields_match(job: Mapping[str, Any], field_selector: str | None) -> bool:
    """As the apiserver selects Jobs on fields: ``status.successful`` is the Job's
    ``status.succeeded`` count (0 when unset), compared with ``=``, ``==`` or ``!=``; the
    requirements are joined by commas, and any other field is refused."""
    for requirement in field_selector.split(",") if field_selector else []:
        field, unequal, value = requirement.partition("!=")
        if not unequal:
            field, _, value = requirement.replace("==", "=").partition("=")
        if field != "status.successful":
            raise ValueError(f'field label not supported: "{field}"')
        succeeded = str((job.get("status") or {}).get("succeeded") or 0)
        if (succeeded == value) == bool(unequal):
            return False
    return True


def _created(job: Mapping[str, Any], *, created: bool) -> CreatedJob:
    metadata = job["metadata"]
    return CreatedJob(
        uid=metadata["uid"],
        created=created,
        controller_uid=JobIdentity.run_controller(metadata),
    )
