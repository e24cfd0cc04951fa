"""A thin async wrapper over the official ``kubernetes`` client.

The sync client runs in a bounded thread pool of its own; responses are read as raw JSON
(dicts), which is cheaper than the client's model classes. Every call may go through a
token bucket (``api_qps``) because kopf has no client-side rate limiter; the operator
paces Job creations itself, fairly between namespaces (``operator/creation_turns.py``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes import client as k8s

from flowforge.domain.api import (
    DEFINITION_PLURAL,
    GROUP,
    POLICY_PLURAL,
    RUN_PLURAL,
    VERSION,
)
from flowforge.domain.execution import TerminatedContainer, container_termination
from flowforge.domain.observed_pod import CONTROLLER_UID_LABEL
from flowforge.domain.run_actions import PLURAL as ACTION_PLURAL
from flowforge.kube.config_map import ConfigMapCalls
from flowforge.kube.configuration import load_configuration
from flowforge.kube.errors import KubernetesError, kubernetes_errors
from flowforge.kube.events import RunEvent, event_body, series_change
from flowforge.kube.job_record import controlled_pods
from flowforge.kube.jobs import CONTAINER_NAME, CreatedJob, JobIdentity
from flowforge.kube.pages import ListPage, pages, read_page

_T = TypeVar("_T")
# a page of a Job's Pods: a Job makes one, a forger many
JOB_PODS_PAGE = 20


class TokenBucket:
    """Allows ``rate`` acquisitions per second on average, bursts up to ``burst``."""

    def __init__(self, *, rate: float, burst: int) -> None:
        self._rate = rate
        self._capacity = float(burst)
        self._tokens = float(burst)
        self._updated = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        if self._rate <= 0:
            return
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(
                    self._capacity, self._tokens + (now - self._updated) * self._rate
                )
                self._updated = now
                if self._tokens >= 1.0:
                    self._tokens -= 1.0
                    return
                await asyncio.sleep((1.0 - self._tokens) / self._rate)


def _json(body: bytes) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(body)
    return data


def _paging(limit: int, continue_token: str | None) -> dict[str, Any]:
    return {"limit": limit} | ({"_continue": continue_token} if continue_token else {})


def _body(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """Call the API and read the raw response body, and hand the connection back."""
    return _read(function, args, kwargs, read=lambda response: bytes(response.data))


def _page(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> ListPage:
    """Call a LIST and read its page within ``kwargs["max_bytes"]`` (``pages.read_page``)."""
    max_bytes = kwargs.pop("max_bytes")
    return _read(function, args, kwargs, read=lambda r: read_page(r, max_bytes=max_bytes))


def _read(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    read: Callable[[Any], _T],
) -> _T:
    """Call the API, ``read`` the raw response, and hand the connection back.

    A response left unread keeps its connection out of the pool, and the next call pays a
    new TLS handshake (on both ends: that was most of the operator's and much of the
    apiserver's CPU under load). The client's exceptions leave as :class:`KubernetesError`.
    """
    with kubernetes_errors():
        response = function(*args, _preload_content=False, **kwargs)
        try:
            return read(response)
        finally:
            response.release_conn()


def _created(job: Mapping[str, Any], *, created: bool) -> CreatedJob:
    metadata = job["metadata"]
    return CreatedJob(
        uid=str(metadata["uid"]),
        created=created,
        controller_uid=JobIdentity.run_controller(metadata),
    )


class KubeClient(ConfigMapCalls):
    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        api_qps: float = 0.0,
        api_burst: int = 1,
        threads: int = 16,
    ) -> None:
        self._api = api_client
        self._batch = k8s.BatchV1Api(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._custom = k8s.CustomObjectsApi(api_client)
        # Job creation has threads of its own, and everything else (status patches, Events,
        # reads) a quarter as many: under a burst those queue here, in this process, instead
        # of at the apiserver ahead of the Job creations that hand work on
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads // 4), thread_name_prefix="kube")
        self._jobs_pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube-jobs")
        # kopf has no client-side limiter; ours covers every call made through this client
        self._api_bucket = TokenBucket(rate=api_qps, burst=max(1, api_burst))

    @classmethod
    def connect(
        cls,
        *,
        kubeconfig: str | None = None,
        api_qps: float = 0.0,
        api_burst: int = 1,
        threads: int = 16,
    ) -> KubeClient:
        configuration = load_configuration(kubeconfig)
        configuration.connection_pool_maxsize = 2 * threads
        return cls(
            k8s.ApiClient(configuration),
            api_qps=api_qps,
            api_burst=api_burst,
            threads=threads,
        )

    async def _call(self, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> bytes:
        """One API call on the shared threads; returns the raw response body."""
        return await self._run(function, _body, pool=self._pool, args=args, kwargs=kwargs)

    async def _call_critical(
        self, function: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> bytes:
        """One API call on the Job-creation threads."""
        return await self._run(function, _body, pool=self._jobs_pool, args=args, kwargs=kwargs)

    async def _list_page(
        self, function: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> ListPage:
        """One LIST call on the shared threads, its page read (and parsed there) within
        ``max_bytes``, else :class:`~flowforge.kube.pages.PageTooLarge`."""
        return await self._run(function, _page, pool=self._pool, args=args, kwargs=kwargs)

    async def _run(
        self,
        function: Callable[..., Any],
        reader: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], _T],
        *,
        pool: ThreadPoolExecutor,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> _T:
        await self._api_bucket.acquire()
        return await asyncio.get_running_loop().run_in_executor(
            pool, reader, function, args, kwargs
        )

    @property
    def api_client(self) -> k8s.ApiClient:
        return self._api

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._jobs_pool.shutdown(wait=False, cancel_futures=True)
        self._api.close()  # type: ignore[no-untyped-call]

    # Jobs

    async def create_job(self, manifest: Mapping[str, Any]) -> CreatedJob:
        """Create a Job; when one already has the name (success), report that one's uid and
        controller instead, for the caller to judge whether it is the run's."""
        namespace = manifest["metadata"]["namespace"]
        name = manifest["metadata"]["name"]
        for tries_left in (1, 0):
            try:
                response = await self._call_critical(
                    self._batch.create_namespaced_job, namespace, manifest
                )
            except KubernetesError as error:
                if not error.conflict:
                    raise
                existing = await self.read_job(namespace=namespace, name=name)
                if existing is None and tries_left:
                    continue  # deleted in between: the name is free again
                if existing is None:
                    raise
                return _created(existing, created=False)
            return _created(_json(response), created=True)
        raise AssertionError("unreachable")  # pragma: no cover

    async def delete_job(self, *, namespace: str, name: str, uid: str | None = None) -> bool:
        """Delete a Job and (in the background) its Pods; False when it was already gone, or
        (``uid`` given) when the Job of that name is another one."""
        options: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        try:
            await self._call(self._batch.delete_namespaced_job, name, namespace, body=options)
        except KubernetesError as error:
            if error.not_found or (uid is not None and error.conflict):
                return False
            raise
        return True

    async def namespace_uid(self, namespace: str) -> str | None:
        try:
            response = await self._call(self._core.read_namespace, namespace)
        except KubernetesError as error:
            if error.not_found:
                return None
            raise
        return str(_json(response)["metadata"]["uid"])

    async def read_job(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            response = await self._call(self._batch.read_namespaced_job, name, namespace)
        except KubernetesError as error:
            if error.not_found:
                return None
            raise
        return _json(response)

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
        """One page of the Jobs with the label (and the fields, when given), read within
        ``max_bytes``; the next page from ``continue_token``."""
        paging = _paging(limit, continue_token) | {"label_selector": label_selector}
        if field_selector is not None:
            paging["field_selector"] = field_selector
        if namespace is None:
            return await self._list_page(
                self._batch.list_job_for_all_namespaces, max_bytes=max_bytes, **paging
            )
        return await self._list_page(
            self._batch.list_namespaced_job, namespace, max_bytes=max_bytes, **paging
        )

    async def job_pods(
        self, *, namespace: str, job_name: str, job_uid: str
    ) -> list[dict[str, Any]]:
        """The Pods the Job controls (ownerReference uid = the Job's), oldest first, as small
        records (``job_record.controlled_pods``): the labels the Job controller sets select
        them, but they are only a claim, and anyone who may create a Pod here can make one,
        as fat as it likes, so they are read in pages within a byte budget."""
        selector = f"job-name={job_name},{CONTROLLER_UID_LABEL}={job_uid}"

        async def fetch(*, limit: int, continue_token: str | None, max_bytes: int) -> ListPage:
            paging = _paging(limit, continue_token) | {"label_selector": selector}
            return await self._list_page(
                self._core.list_namespaced_pod, namespace, max_bytes=max_bytes, **paging
            )

        return await controlled_pods(pages(fetch, limit=JOB_PODS_PAGE), job_uid=job_uid)

    async def job_termination(
        self, *, namespace: str, job_name: str, job_uid: str
    ) -> TerminatedContainer | None:
        """How the task container of the Job's newest Pod ended, when a Pod still says."""
        pods = await self.job_pods(namespace=namespace, job_name=job_name, job_uid=job_uid)
        return container_termination(pods, container=CONTAINER_NAME)

    # WorkflowRuns

    async def read_run(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._read_custom(RUN_PLURAL, namespace=namespace, name=name)

    async def _read_custom(
        self, plural: str, *, namespace: str, name: str
    ) -> dict[str, Any] | None:
        try:
            response = await self._call(
                self._custom.get_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
            )
        except KubernetesError as error:
            if error.not_found:
                return None
            raise
        return _json(response)

    async def list_runs(
        self, *, namespace: str | None, limit: int, continue_token: str | None, max_bytes: int
    ) -> ListPage:
        """One page of the WorkflowRuns, read within ``max_bytes``; the next page from
        ``continue_token``."""
        paging = _paging(limit, continue_token) | {"max_bytes": max_bytes}
        return await self._custom_page(RUN_PLURAL, namespace=namespace, paging=paging)

    async def read_definition(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._read_custom(DEFINITION_PLURAL, namespace=namespace, name=name)

    async def list_definitions(
        self, *, namespace: str, limit: int, continue_token: str | None, max_bytes: int
    ) -> ListPage:
        """One page of the namespace's WorkflowDefinition objects, read within ``max_bytes``
        from the apiserver (the first page a quorum read, so an object created a moment ago
        is listed; the next ones of the same snapshot)."""
        paging = _paging(limit, continue_token) | {"max_bytes": max_bytes}
        return await self._custom_page(DEFINITION_PLURAL, namespace=namespace, paging=paging)

    async def _custom_page(
        self, plural: str, *, namespace: str | None, paging: dict[str, Any]
    ) -> ListPage:
        if namespace is None:
            return await self._list_page(
                self._custom.list_cluster_custom_object, GROUP, VERSION, plural, **paging
            )
        return await self._list_page(
            self._custom.list_namespaced_custom_object, GROUP, VERSION, namespace, plural, **paging
        )

    async def patch_run_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any]
    ) -> bool:
        """Merge-patch the run's status subresource; False when the run is gone."""
        return await self._patch_status(RUN_PLURAL, namespace=namespace, name=name, status=status)

    async def json_patch_run(
        self, *, namespace: str, name: str, operations: Sequence[Mapping[str, Any]]
    ) -> bool:
        """JSON-patch the run object (e.g. its finalizers); False when it is gone. A failed
        ``test`` operation (a stale view) raises a KubernetesError with status 422."""
        try:
            await self._call(
                self._custom.patch_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                RUN_PLURAL,
                name,
                [dict(operation) for operation in operations],
                _content_type="application/json-patch+json",
            )
        except KubernetesError as error:
            if error.not_found:
                return False
            raise
        return True

    async def patch_definition_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any]
    ) -> bool:
        """Merge-patch a WorkflowDefinition's status; False when it is gone."""
        return await self._patch_status(
            DEFINITION_PLURAL, namespace=namespace, name=name, status=status
        )

    async def patch_action_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any]
    ) -> bool:
        """Merge-patch a WorkflowRunAction's status; False when it is gone."""
        return await self._patch_status(
            ACTION_PLURAL, namespace=namespace, name=name, status=status
        )

    async def _patch_status(
        self, plural: str, *, namespace: str, name: str, status: Mapping[str, Any]
    ) -> bool:
        try:
            await self._call(
                self._custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                {"status": dict(status)},
            )
        except KubernetesError as error:
            if error.not_found:
                return False
            raise
        return True

    async def post_run_event(self, event: RunEvent) -> None:
        body = event_body(event, now=datetime.now(UTC))
        await self._call(self._core.create_namespaced_event, event.namespace, body)

    async def write_run_event_series(
        self, event: RunEvent, *, name: str, count: int, exists: bool
    ) -> None:
        """Create or update the Event ``name`` that stands for ``count`` similar Events of
        the run (``domain/event_series.py``): updated in place, as the event recorder does."""
        now = datetime.now(UTC)
        change = series_change(message=event.message, count=count, now=now)
        namespace = event.namespace
        if exists:
            try:
                await self._call(self._core.patch_namespaced_event, name, namespace, change)
                return
            except KubernetesError as error:
                if not error.not_found:  # expired (Events live an hour): create it again
                    raise
        body = event_body(event, now=now, name=name, count=count)
        try:
            await self._call(self._core.create_namespaced_event, namespace, body)
        except KubernetesError as error:
            if not error.conflict:
                raise
            await self._call(self._core.patch_namespaced_event, name, namespace, change)

    # Admission's reads: the namespace's policies, and what a user may do

    async def list_policies(self, *, namespace: str) -> list[dict[str, Any]]:
        """The namespace's FlowForgePolicy objects (read from the apiserver, not a cache)."""
        response = await self._call(
            self._custom.list_namespaced_custom_object, GROUP, VERSION, namespace, POLICY_PLURAL
        )
        return ListPage.of(_json(response)).items

    async def review_access(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create a SubjectAccessReview; its ``status`` says whether the user may."""
        authorization = k8s.AuthorizationV1Api(self._api)
        response = await self._call(authorization.create_subject_access_review, dict(body))
        return _json(response)
