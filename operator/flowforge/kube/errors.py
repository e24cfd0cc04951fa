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


class KubernetesError(FlowForgeError):
    """A Kubernetes API call that failed; ``status`` is None when no response came."""

    def __init__(self, message: str, *, status: int | None, reason: str) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason
        self.retryable = status is None or status == TOO_MANY_REQUESTS or status >= 500

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


def _api_message(error: ApiException) -> str:
    """The apiserver's own message (a Status object's ``message``), else its HTTP status."""
    try:
        message = json.loads(error.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    text = str(message or f"{error.status} {error.reason}").strip()
    return (text.splitlines() or [f"{error.status}"])[0]


def from_client_error(error: ApiException | HTTPError) -> KubernetesError:
    """The FlowForge exception for one of the client's."""
    if isinstance(error, ApiException) and error.status:
        status = int(error.status)
        kind = (
            KubernetesUnavailable
            if status == TOO_MANY_REQUESTS or status >= 500
            else KubernetesRefusal
        )
        return kind(_api_message(error), status=status, reason=str(error.reason or ""))
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
