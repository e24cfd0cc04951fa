"""Server-side dry-run creation of a Job or a Pod: what the apiserver would say to it.

``dryRun=All`` runs validation and every admission step (Pod Security, quota, webhooks,
ValidatingAdmissionPolicies) and stores nothing. ``fieldValidation=Strict`` makes a field the
apiserver does not know an error instead of a silent drop. The answer keeps what the
apiserver said in full: the status, the message, each cause with its field path, and the
warnings (the ``Warning`` headers), for admission to map back onto a definition's fields.
Every call has a connect and read timeout, so an apiserver that does not answer is an answer.

`CachedDryRuns` remembers the acceptances for a few seconds (see its docstring and
docs/security.md for what that lets through).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, Protocol

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

DEFAULT_REQUEST_TIMEOUT: Final = 4.0
ACCEPT_TTL_SECONDS: Final = 10.0
MAX_CACHED: Final = 1024
_PATHS: Final = {
    "Job": "/apis/batch/v1/namespaces/{namespace}/jobs",
    "Pod": "/api/v1/namespaces/{namespace}/pods",
}


@dataclass(frozen=True)
class Cause:
    field: str
    message: str


@dataclass(frozen=True)
class DryRunAnswer:
    """``status`` None: no answer came (unreachable, timed out)."""

    status: int | None
    message: str = ""
    reason: str = ""
    causes: tuple[Cause, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def accepted(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def _warnings(headers: Any) -> tuple[str, ...]:
    if headers is None:
        return ()
    values = headers.getlist("Warning") if hasattr(headers, "getlist") else []
    if not values and headers.get("Warning"):
        values = [headers["Warning"]]
    # RFC 7234 warn-code warn-agent "text": keep the text
    texts = []
    for value in values:
        code, _, rest = str(value).partition(" ")
        _agent, _, text = rest.partition(" ")
        texts.append(text.strip().strip('"') if code.isdigit() and text else str(value))
    return tuple(texts)


def _answer(status: int, body: bytes, headers: Any) -> DryRunAnswer:
    warnings = _warnings(headers)
    if 200 <= status < 300:
        return DryRunAnswer(status=status, warnings=warnings)
    try:
        parsed = json.loads(body or b"{}")
    except ValueError:
        parsed = {}
    document: Mapping[str, Any] = parsed if isinstance(parsed, Mapping) else {}
    details = document.get("details")
    causes = tuple(
        Cause(field=str(cause.get("field") or ""), message=str(cause.get("message") or ""))
        for cause in ((details if isinstance(details, Mapping) else {}).get("causes") or [])
        if isinstance(cause, Mapping)
    )
    return DryRunAnswer(
        status=status,
        message=str(document.get("message") or f"HTTP {status}"),
        reason=str(document.get("reason") or ""),
        causes=causes,
        warnings=warnings,
    )


class DryRunner:
    """Dry-run creations through ``api_client``, on a few threads of their own."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        threads: int = 4,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    ) -> None:
        self._api = api_client
        self._timeout = request_timeout
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dry-run")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def create(self, manifest: Mapping[str, Any]) -> DryRunAnswer:
        """What the apiserver says to creating ``manifest`` (a Job or a Pod)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._create, manifest)

    def _create(self, manifest: Mapping[str, Any]) -> DryRunAnswer:
        # the generic call, not the typed create_namespaced_*: those read the body into the
        # client's models first, which drops what they do not know
        request = self._api.param_serialize(
            method="POST",
            resource_path=_PATHS[str(manifest["kind"])],
            path_params={"namespace": manifest["metadata"]["namespace"]},
            query_params=[("dryRun", "All"), ("fieldValidation", "Strict")],
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=dict(manifest),
            auth_settings=["BearerToken"],
        )
        try:
            response = self._api.call_api(*request, _request_timeout=(self._timeout, self._timeout))
            try:
                body = response.read()  # type: ignore[no-untyped-call]
            finally:
                response.response.release_conn()
        except ApiException as error:
            return _answer(int(error.status or 0), (error.body or "").encode(), error.headers)
        except (HTTPError, OSError) as error:
            detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
            return DryRunAnswer(status=None, message=f"no answer from the apiserver: {detail}")
        return _answer(int(response.status), body or b"", response.headers)


class DryRunCreator(Protocol):
    async def create(self, manifest: Mapping[str, Any]) -> DryRunAnswer: ...


class CachedDryRuns:
    """The apiserver's acceptance of a manifest, remembered for ``ttl`` seconds.

    Only acceptances: a refusal, a transient answer or no answer is asked again every time,
    so a cached entry can only ever let through what the apiserver let through a moment
    ago. The key is the manifest's whole canonical JSON, namespace included (it is the
    manifest's ``metadata.namespace``, the review's, and is part of the key on its own too):
    another namespace, a changed template or type name, or a change of anything the Job
    carries is a new question. What a stale entry can let through for up to ``ttl``: a
    template the namespace has just stopped accepting (a stricter Pod Security label, a
    deleted ServiceAccount, a new LimitRange or admission policy); the Job itself is still
    created through the apiserver at run time, and a refusal then fails the attempt
    (``JobRefused``). At most ``MAX_CACHED`` entries (then expired ones go, then all).
    """

    def __init__(
        self,
        creator: DryRunCreator,
        *,
        ttl: float = ACCEPT_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._creator = creator
        self._ttl = ttl
        self._clock = clock
        self._accepted: dict[tuple[str, str], tuple[DryRunAnswer, float]] = {}

    async def create(self, manifest: Mapping[str, Any]) -> DryRunAnswer:
        namespace = str(manifest["metadata"]["namespace"])
        key = (namespace, json.dumps(manifest, sort_keys=True, separators=(",", ":")))
        cached = self._accepted.get(key)
        if cached is not None and cached[1] > self._clock():
            return cached[0]
        answer = await self._creator.create(manifest)
        if answer.accepted:
            self._remember(key, answer)
        return answer

    def _remember(self, key: tuple[str, str], answer: DryRunAnswer) -> None:
        if len(self._accepted) >= MAX_CACHED:
            now = self._clock()
            self._accepted = {k: v for k, v in self._accepted.items() if v[1] > now}
            if len(self._accepted) >= MAX_CACHED:
                self._accepted.clear()
        self._accepted[key] = (answer, self._clock() + self._ttl)
