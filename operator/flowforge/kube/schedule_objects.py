"""The Kubernetes calls of the schedule controller (``operator/schedules.py``): the
WorkflowRun a fire makes (owned by its schedule, named by the nominal time, AlreadyExists
is success when it is that fire's own), the schedule's status, cancelling a run (Replace),
and the schedule's Warning Events."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from flowforge.domain.api import API_VERSION, GROUP, PREFIX, RUN_KIND, RUN_PLURAL, VERSION
from flowforge.domain.schedule import KIND, PLURAL

SCHEDULE_LABEL = f"{PREFIX}/schedule"
NOMINAL_TIME_ANNOTATION = f"{PREFIX}/nominal-time"
SCHEDULED_BY_ANNOTATION = f"{PREFIX}/scheduled-by"


def run_manifest(
    *,
    schedule: Mapping[str, Any],
    run_name: str,
    nominal_time: datetime,
    version: int | None,
    parameters: Mapping[str, Any],
    author: str | None,
    backfill: str | None,
    manual: bool,
) -> dict[str, Any]:
    """The WorkflowRun of one fire: the schedule its controller owner (deleted with it),
    labelled with the schedule, annotated with the nominal time and the schedule's author."""
    metadata = schedule["metadata"]
    annotations = {NOMINAL_TIME_ANNOTATION: nominal_time.astimezone(UTC).isoformat()}
    if author:
        annotations[SCHEDULED_BY_ANNOTATION] = author
    if backfill:
        annotations[f"{PREFIX}/backfill"] = backfill
    if manual:
        annotations[f"{PREFIX}/manual-trigger"] = "true"
    spec: dict[str, Any] = {"workflow": schedule["spec"]["workflow"]}
    if version is not None:
        spec["version"] = version
    if parameters:
        spec["parameters"] = dict(parameters)
    return {
        "apiVersion": API_VERSION,
        "kind": RUN_KIND,
        "metadata": {
            "name": run_name,
            "namespace": metadata["namespace"],
            "labels": {
                SCHEDULE_LABEL: metadata["name"],
                "app.kubernetes.io/managed-by": "flowforge",
            },
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": KIND,
                    "name": metadata["name"],
                    "uid": metadata["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


class ScheduleObjects:
    """Calls through the operator's API client (threads: the client is synchronous)."""

    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._custom = k8s.CustomObjectsApi(api_client)
        self._core = k8s.CoreV1Api(api_client)

    async def create_run(self, manifest: Mapping[str, Any]) -> str | None:
        """Create the run; its uid, also when it exists already and is this schedule's
        (same owner uid); None when another object holds the name."""
        namespace = manifest["metadata"]["namespace"]
        try:
            created: Any = await asyncio.to_thread(
                self._custom.create_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                RUN_PLURAL,
                dict(manifest),
            )
            return str(created["metadata"]["uid"])
        except ApiException as error:
            if error.status != 409:
                raise
        existing: Any = await asyncio.to_thread(
            self._custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            RUN_PLURAL,
            manifest["metadata"]["name"],
        )
        owner = manifest["metadata"]["ownerReferences"][0]["uid"]
        owners = existing["metadata"].get("ownerReferences") or []
        if any(reference.get("uid") == owner for reference in owners):
            return str(existing["metadata"]["uid"])
        return None

    async def list_runs(self, *, namespace: str, schedule: str) -> list[dict[str, Any]]:
        """The WorkflowRun objects a schedule made (its label)."""
        listing: Any = await asyncio.to_thread(
            self._custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            RUN_PLURAL,
            label_selector=f"{SCHEDULE_LABEL}={schedule}",
        )
        return list(listing["items"])

    async def delete_run(self, *, namespace: str, name: str, uid: str) -> None:
        try:
            await asyncio.to_thread(
                self._custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                RUN_PLURAL,
                name,
                body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid)),
            )
        except ApiException as error:
            if error.status not in (404, 409):  # gone, or another object holds the name
                raise

    async def cancel_run(self, *, namespace: str, name: str) -> None:
        try:
            await asyncio.to_thread(
                self._custom.patch_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                RUN_PLURAL,
                name,
                {"spec": {"cancel": True}},
            )
        except ApiException as error:
            if error.status != 404:
                raise

    async def patch_status(self, *, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        try:
            await asyncio.to_thread(
                self._custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"status": dict(status)},
            )
        except ApiException as error:
            if error.status != 404:  # deleted meanwhile
                raise

    async def warn(self, schedule: Mapping[str, Any], *, reason: str, message: str) -> None:
        metadata = schedule["metadata"]
        now = datetime.now(UTC)
        body: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{metadata['name']}.{uuid.uuid4().hex[:12]}",
                "namespace": metadata["namespace"],
            },
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": metadata["name"],
                "namespace": metadata["namespace"],
                "uid": metadata["uid"],
            },
            "reason": reason,
            "message": message,
            "type": "Warning",
            "source": {"component": "flowforge-operator"},
            "firstTimestamp": now.isoformat(),
            "lastTimestamp": now.isoformat(),
            "count": 1,
        }
        await asyncio.to_thread(self._core.create_namespaced_event, metadata["namespace"], body)
