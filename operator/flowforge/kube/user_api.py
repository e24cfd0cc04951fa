"""Calls to the Kubernetes API made as the person who asked, with their own bearer token.

The read API server (``flowforge.server``) never writes with its own credentials: a cancel
or a retry is the user's own patch or create, so RBAC and admission judge the user. Only the
apiserver's address and CA are taken from this process's configuration, never its
credentials. Every call is bounded in time and in the bytes it reads.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

import aiohttp

from flowforge.domain.api import API_VERSION, RUN_PLURAL
from flowforge.domain.observed_pod import CONTROLLER_UID_LABEL, JobClaim, job_claim
from flowforge.domain.run_actions import PLURAL as ACTION_PLURAL
from flowforge.domain.schedule import PLURAL as SCHEDULE_PLURAL
from flowforge.kube.errors import (
    TOO_MANY_REQUESTS,
    KubernetesError,
    KubernetesRefusal,
    KubernetesUnavailable,
)

TIMEOUT_SECONDS: Final = 15.0
MAX_RESPONSE_BYTES: Final = 4 * 1024 * 1024
# the WorkflowSchedules one listing reads (a namespace holding more shows the first ones)
MAX_SCHEDULES: Final = 500


def _controlled_by(pod: Mapping[str, Any], namespace: str, job_uid: str) -> bool:
    claim = job_claim(pod)
    return isinstance(claim, JobClaim) and (claim.namespace, claim.job_uid) == (namespace, job_uid)


def _error(status: int, body: bytes) -> KubernetesError:
    try:
        message = str(json.loads(body).get("message") or "")
    except (ValueError, AttributeError):
        message = ""
    message = (message or body.decode(errors="replace")[:200] or f"HTTP {status}").strip()
    kind = (
        KubernetesUnavailable if status == TOO_MANY_REQUESTS or status >= 500 else KubernetesRefusal
    )
    return kind(message.splitlines()[0], status=status, reason=str(status))


async def _read_at_most(stream: aiohttp.StreamReader, limit: int) -> bytes:
    """The body up to ``limit`` bytes (``read(n)`` returns whatever one chunk holds)."""
    chunks: list[bytes] = []
    total = 0
    async for chunk in stream.iter_chunked(64 * 1024):
        chunks.append(chunk)
        total += len(chunk)
        if total >= limit:
            break
    return b"".join(chunks)[:limit]


class UserApi:
    """The apiserver at ``host``, trusted through ``ca_file`` (None: the system's CAs)."""

    def __init__(self, *, host: str, ca_file: str | None, verify: bool = True) -> None:
        self._host = host.rstrip("/")
        context = ssl.create_default_context(cafile=ca_file) if verify else False
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context, limit=32),
            timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS),
        )

    async def close(self) -> None:
        await self._session.close()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        token: str,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
        max_bytes: int = MAX_RESPONSE_BYTES,
    ) -> tuple[bytes, bool]:
        """The response body (at most ``max_bytes``) and whether it was cut there."""
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        try:
            async with self._session.request(
                method, self._host + path, headers=headers, data=data, params=params
            ) as response:
                content = await _read_at_most(response.content, max_bytes + 1)
                if response.status >= 400:
                    raise _error(response.status, content)
        except (aiohttp.ClientError, TimeoutError) as error:
            raise KubernetesUnavailable(
                f"cannot reach the Kubernetes API: {error or type(error).__name__}",
                status=None,
                reason=type(error).__name__,
            ) from error
        return content[:max_bytes], len(content) > max_bytes

    async def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        content, _ = await self._request(method, path, **kwargs)
        document: dict[str, Any] = json.loads(content)
        return document

    @staticmethod
    def _path(plural: str, namespace: str, name: str = "") -> str:
        path = f"/apis/{API_VERSION}/namespaces/{quote(namespace)}/{plural}"
        return f"{path}/{quote(name)}" if name else path

    @classmethod
    def _runs_path(cls, namespace: str, name: str = "") -> str:
        return cls._path(RUN_PLURAL, namespace, name)

    async def cancel_run(self, *, token: str, namespace: str, name: str) -> dict[str, Any]:
        """Set ``spec.cancel: true`` on the WorkflowRun (a merge patch)."""
        return await self._json(
            "PATCH",
            self._runs_path(namespace, name),
            token=token,
            body={"spec": {"cancel": True}},
            content_type="application/merge-patch+json",
        )

    async def create_run(
        self, *, token: str, namespace: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        return await self._json("POST", self._runs_path(namespace), token=token, body=body)

    async def create_action(
        self, *, token: str, namespace: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Create a WorkflowRunAction (admission records the caller as its actor)."""
        return await self._json(
            "POST", self._path(ACTION_PLURAL, namespace), token=token, body=body
        )

    async def list_schedules(self, *, token: str, namespace: str) -> list[dict[str, Any]]:
        """The namespace's WorkflowSchedules (at most ``MAX_SCHEDULES``)."""
        listing = await self._json(
            "GET",
            self._path(SCHEDULE_PLURAL, namespace),
            token=token,
            params={"limit": str(MAX_SCHEDULES)},
        )
        return [dict(item) for item in listing.get("items") or []]

    async def get_schedule(self, *, token: str, namespace: str, name: str) -> dict[str, Any]:
        return await self._json("GET", self._path(SCHEDULE_PLURAL, namespace, name), token=token)

    async def job_log(
        self, *, token: str, namespace: str, job_uid: str, container: str, max_bytes: int
    ) -> tuple[str, bool] | None:
        """The log of the newest Pod that the Job with uid ``job_uid`` (the one FlowForge
        recorded for the attempt) controls, and whether it was cut at ``max_bytes``; None
        when it has no Pod (any more). A ``job-name`` label, or a controller-uid label on a
        Pod that the Job does not control, is only a claim anyone who may create a Pod here
        can make: the Pod's controller ownerReference must name the uid too."""
        pods = await self._json(
            "GET",
            f"/api/v1/namespaces/{quote(namespace)}/pods",
            token=token,
            params={"labelSelector": f"{CONTROLLER_UID_LABEL}={job_uid}", "limit": "20"},
        )
        items = sorted(
            (pod for pod in pods.get("items") or [] if _controlled_by(pod, namespace, job_uid)),
            key=lambda pod: str(pod.get("metadata", {}).get("creationTimestamp") or ""),
        )
        if not items:
            return None
        pod = str(items[-1]["metadata"]["name"])
        content, cut = await self._request(
            "GET",
            f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/log",
            token=token,
            params={"container": container, "limitBytes": str(max_bytes)},
            max_bytes=max_bytes,
        )
        return content.decode(errors="replace"), cut
