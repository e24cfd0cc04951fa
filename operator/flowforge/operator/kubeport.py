"""The Kubernetes calls the run engine makes, as a Protocol.

``flowforge.kube.client.KubeClient`` is the real implementation; the engine tests run the
engine against an in-memory fake of this port and a real PostgreSQL (``tests/engine``), so
the engine's decisions can be tested without a cluster. Every call is idempotent in the
way the engine relies on: creating an existing Job answers ``created=False`` with the
existing Job's uid and controller (creating a ConfigMap answers the one under the name,
created or existing), deleting a missing one (or one whose uid is not the given one) answers
False, reading a missing object answers None.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from flowforge.domain.execution import TerminatedContainer
from flowforge.kube.config_map import ConfigMapFound
from flowforge.kube.events import RunEvent
from flowforge.kube.jobs import CreatedJob
from flowforge.kube.pages import ListPage


class KubePort(Protocol):
    async def create_job(self, manifest: Mapping[str, Any]) -> CreatedJob: ...

    async def create_config_map(self, manifest: Mapping[str, Any]) -> ConfigMapFound:
        """The ConfigMap now under the name: the one created, or the one already there."""
        ...

    async def config_map_uid(self, *, namespace: str, name: str) -> str | None:
        """The uid of the ConfigMap ``name``; None when there is none."""
        ...

    async def delete_job(self, *, namespace: str, name: str, uid: str | None = None) -> bool:
        """``uid``: delete only that Job (a precondition the apiserver checks)."""
        ...

    async def read_job(self, *, namespace: str, name: str) -> dict[str, Any] | None: ...

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
        """One page (at most ``limit``) of the Jobs with the label (and, with
        ``field_selector``, the fields: the apiserver selects Jobs on ``status.successful``,
        their ``status.succeeded`` count); the next one from the page's ``continue_token``.
        A page longer than ``max_bytes`` is not read: ``kube.pages.PageTooLarge``."""
        ...

    async def job_termination(
        self, *, namespace: str, job_name: str, job_uid: str
    ) -> TerminatedContainer | None:
        """How the task container ended, read only from Pods the Job (``job_uid``) controls."""
        ...

    async def job_pods(
        self, *, namespace: str, job_name: str, job_uid: str
    ) -> list[dict[str, Any]]:
        """The Pods the Job (``job_uid``) controls, oldest first."""
        ...

    async def read_run(self, *, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def namespace_uid(self, namespace: str) -> str | None:
        """The uid the namespace has now; None when there is no such namespace."""
        ...

    async def list_runs(
        self, *, namespace: str | None, limit: int, continue_token: str | None, max_bytes: int
    ) -> ListPage:
        """One page (at most ``limit``) of the WorkflowRuns, as ``list_jobs``."""
        ...

    async def list_policies(self, *, namespace: str) -> list[dict[str, Any]]:
        """The namespace's FlowForgePolicy objects."""
        ...

    async def patch_run_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any]
    ) -> bool: ...

    async def json_patch_run(
        self, *, namespace: str, name: str, operations: Sequence[Mapping[str, Any]]
    ) -> bool: ...

    async def patch_definition_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any]
    ) -> bool: ...

    async def patch_action_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any]
    ) -> bool: ...

    async def post_run_event(self, event: RunEvent) -> None: ...

    async def write_run_event_series(
        self, event: RunEvent, *, name: str, count: int, exists: bool
    ) -> None: ...
