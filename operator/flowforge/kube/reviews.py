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
from flowforge.kube.client import _body, _paging
from flowforge.kube.configuration import load_configuration
from flowforge.kube.pages import ListPage

# namespaces per page of a LIST (the apiserver's continue tokens carry on)
NAMESPACE_PAGE = 500


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

    async def namespace_uids(
        self, names: Sequence[str] | None = None, *, page_size: int = NAMESPACE_PAGE
    ) -> dict[str, str]:
        """The uid each of ``names`` (every namespace when None) has now; a name that is no
        namespace (any more) is left out. One namespace is read by name; more are LISTed
        (``list`` is the verb the server holds) page by page, ``page_size`` at a time, to
        the last page."""
        if names is not None and len(names) <= 1:
            if not names:
                return {}
            response = await self._call(
                self._core.list_namespace, field_selector=f"metadata.name={names[0]}"
            )
            return _uids(response.get("items", []))
        found: dict[str, str] = {}
        token: str | None = None
        while True:
            page = ListPage.of(
                await self._call(self._core.list_namespace, **_paging(page_size, token))
            )
            found.update(_uids(page.items))
            if page.continue_token is None:
                break
            token = page.continue_token
        if names is None:
            return found
        return {name: found[name] for name in names if name in found}


def _uids(items: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    return {str(item["metadata"]["name"]): str(item["metadata"]["uid"]) for item in items}
