"""The questions a front end asks the apiserver about its callers, with its own credentials:
who holds this bearer token (TokenReview), may they do this (SubjectAccessReview), and which
namespaces exist. The sync client runs on a few threads of its own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client as k8s

from flowforge.kube.access_review import UserInfo
from flowforge.kube.client import _body
from flowforge.kube.configuration import load_configuration

MAX_NAMESPACES = 1000


class ApiReviews:
    def __init__(self, api_client: k8s.ApiClient, *, threads: int = 4) -> None:
        self._api = api_client
        self._authentication = k8s.AuthenticationV1Api(api_client)
        self._authorization = k8s.AuthorizationV1Api(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._threads = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="reviews")

    @classmethod
    def connect(cls, *, kubeconfig: str | None = None, threads: int = 4) -> ApiReviews:
        configuration = load_configuration(kubeconfig)
        configuration.connection_pool_maxsize = 2 * threads
        return cls(k8s.ApiClient(configuration), threads=threads)

    @property
    def configuration(self) -> k8s.Configuration:
        """Where the apiserver is (host, CA) as this process reaches it."""
        configuration: k8s.Configuration = self._api.configuration
        return configuration

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        self._api.close()  # type: ignore[no-untyped-call]

    async def _call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(self._threads, lambda: _body(function, args, kwargs))
        return json.loads(body)

    async def review_token(self, token: str) -> UserInfo | None:
        """The user the apiserver authenticates ``token`` as; None when it does not."""
        response = await self._call(
            self._authentication.create_token_review,
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = response.get("status") or {}
        if not isinstance(status, Mapping) or status.get("authenticated") is not True:
            return None
        return UserInfo.from_review(status.get("user"))

    async def review_access(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create a SubjectAccessReview; its ``status`` says whether the user may."""
        response: dict[str, Any] = await self._call(
            self._authorization.create_subject_access_review, dict(body)
        )
        return response

    async def namespace_uids(self, names: Sequence[str]) -> dict[str, str]:
        """The uid each of ``names`` has now; a name that is no namespace (any more) is left
        out. One LIST (``list`` is the verb the server holds), by name for one namespace."""
        if not names:
            return {}
        selector: dict[str, Any] = (
            {"field_selector": f"metadata.name={names[0]}"}
            if len(names) == 1
            else {"limit": MAX_NAMESPACES}
        )
        response = await self._call(self._core.list_namespace, **selector)
        wanted = set(names)
        return {
            str(item["metadata"]["name"]): str(item["metadata"]["uid"])
            for item in response.get("items", [])
            if item["metadata"]["name"] in wanted
        }

    async def namespace_names(self) -> list[str]:
        response = await self._call(self._core.list_namespace, limit=MAX_NAMESPACES)
        return sorted(str(item["metadata"]["name"]) for item in response.get("items", []))
