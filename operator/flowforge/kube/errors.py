"""The one edge where the Kubernetes client's exceptions become FlowForge's.

::

    FlowForgeError
    └── KubernetesError              status, reason, message, retryable (mixin of both below)
        ├── KubernetesRefusal        UserError: the apiserver refused the request (4xx but 429)
        └── KubernetesUnavailable    InfrastructureError: 429, 5xx, or the apiserver unreachable

Blame and retrying are separate questions (as in :class:`FlowForgeError`): the class says whose
fault it is (a refusal is about the request: not found, forbidden, conflict, invalid),
``retryable`` whether sending it again may help (429, 5xx and connection failures; never a 4xx
refusal).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from flowforge.domain.errors import FlowForgeError, InfrastructureError, UserError

TOO_MANY_REQUESTS = 429
FORBIDDEN = 403
NAMESPACE_TERMINATING_CAUSE = "NamespaceTerminating"


class KubernetesError(FlowForgeError):
    """A Kubernetes API call that failed; ``status`` is None when no response came."""

    def __init__(
        self, message: str, *, status: int | None, reason: str, causes: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason
        self.causes = causes  # the reasons of the Status's ``details.causes``
        self.retryable = status is None or status == TOO_MANY_REQUESTS or status >= 500

    @property
    def namespace_terminating(self) -> bool:
        """403: the namespace is being deleted, and nothing new may be created in it again
        (the apiserver's NamespaceLifecycle admission)."""
        return self.status == FORBIDDEN and NAMESPACE_TERMINATING_CAUSE in self.causes

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        """409: the object exists already, or changed since it was read."""
        return self.status == 409


class KubernetesRefusal(KubernetesError, UserError):
    """The apiserver refused the request (4xx other than 429): not found, forbidden, invalid."""


class KubernetesUnavailable(KubernetesError, InfrastructureError):
    """The apiserver could not serve the request now (429, 5xx), or could not be reached."""


def _api_status(error: ApiException) -> tuple[str, tuple[str, ...]]:
    """The apiserver's own message (a Status object's ``message``, else the HTTP status) and
    the reasons of its causes."""
    try:
        status = json.loads(error.body or "{}")
        message = status.get("message")
        causes = tuple(
            str(cause.get("reason"))
            for cause in (status.get("details") or {}).get("causes") or []
            if isinstance(cause, dict) and cause.get("reason")
        )
    except (ValueError, AttributeError):
        message, causes = None, ()
    text = str(message or f"{error.status} {error.reason}").strip()
    return (text.splitlines() or [f"{error.status}"])[0], causes


def from_client_error(error: ApiException | HTTPError) -> KubernetesError:
    """The FlowForge exception for one of the client's."""
    if isinstance(error, ApiException) and error.status:
        status = int(error.status)
        kind = (
            KubernetesUnavailable
            if status == TOO_MANY_REQUESTS or status >= 500
            else KubernetesRefusal
        )
        message, causes = _api_status(error)
        return kind(message, status=status, reason=str(error.reason or ""), causes=causes)
    detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return KubernetesUnavailable(
        f"cannot reach the Kubernetes API: {detail}", status=None, reason=type(error).__name__
    )


@contextmanager
def kubernetes_errors() -> Iterator[None]:
    """Raise the client's exceptions inside the block as :class:`KubernetesError`."""
    try:
        yield
    except (ApiException, HTTPError) as error:
        raise from_client_error(error) from error
