"""The Kubernetes client's exceptions become FlowForge's at one edge, blame apart from retrying."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError, NewConnectionError, ProtocolError

from flowforge.cli.output import EXIT_FAILED, EXIT_UNAVAILABLE, exit_code_for
from flowforge.domain.errors import InfrastructureError, UserError
from flowforge.kube.errors import (
    KubernetesError,
    KubernetesRefusal,
    KubernetesUnavailable,
    from_client_error,
    kubernetes_errors,
)

PACKAGE = Path(__file__).parents[2] / "operator" / "flowforge"


def api_exception(status: int, reason: str, message: str | None = None) -> ApiException:
    error = ApiException(status=status, reason=reason)
    if message is not None:
        error.body = json.dumps({"kind": "Status", "status": "Failure", "message": message})
    return error


@pytest.mark.parametrize(
    ("status", "blame", "retryable"),
    [
        (400, UserError, False),
        (401, UserError, False),
        (403, UserError, False),
        (404, UserError, False),
        (409, UserError, False),
        (422, UserError, False),
        (429, InfrastructureError, True),
        (500, InfrastructureError, True),
        (503, InfrastructureError, True),
    ],
)
def test_statuses_map_to_blame_and_retryable_separately(
    status: int, blame: type[Exception], retryable: bool
) -> None:
    mapped = from_client_error(api_exception(status, "Reason", f"the server says {status}"))
    assert isinstance(mapped, blame) and isinstance(mapped, KubernetesError)
    assert (mapped.status, mapped.reason, mapped.retryable) == (status, "Reason", retryable)
    assert mapped.message == f"the server says {status}"
    expected_exit = EXIT_FAILED if blame is UserError else EXIT_UNAVAILABLE
    assert exit_code_for(mapped) == expected_exit


def test_the_message_is_the_apiserver_s_first_line_else_the_status() -> None:
    multi = from_client_error(api_exception(422, "Unprocessable Entity", "spec.x: bad\nmore"))
    assert str(multi) == "spec.x: bad"
    bare = from_client_error(api_exception(404, "Not Found"))
    assert str(bare) == "404 Not Found" and bare.not_found and not bare.conflict
    assert from_client_error(api_exception(409, "Conflict")).conflict


@pytest.mark.parametrize(
    "error",
    [
        NewConnectionError(None, "Failed to establish a new connection: [Errno 111] refused"),
        MaxRetryError(None, "/version", reason=None),
        ProtocolError("Connection aborted."),
        ApiException(status=0, reason="no response"),
    ],
    ids=["refused", "retries", "aborted", "no-status"],
)
def test_no_response_is_the_system_s_failure_and_retryable(error: Exception) -> None:
    mapped = from_client_error(error)  # type: ignore[arg-type]
    assert isinstance(mapped, KubernetesUnavailable) and isinstance(mapped, InfrastructureError)
    assert mapped.status is None and mapped.retryable
    assert str(mapped).startswith("cannot reach the Kubernetes API: ")


def test_the_context_manager_raises_the_mapped_error_from_the_client_s() -> None:
    original = api_exception(403, "Forbidden", 'jobs is forbidden: User "x" cannot create')
    with pytest.raises(KubernetesRefusal) as raised, kubernetes_errors():
        raise original
    assert raised.value.__cause__ is original and not raised.value.retryable
    with kubernetes_errors():  # anything else passes through untouched
        pass
    with pytest.raises(ValueError), kubernetes_errors():
        raise ValueError("not ours")


def test_no_module_outside_flowforge_kube_imports_the_client_s_exceptions() -> None:
    importers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "kube":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Attribute):
                names = [node.attr]
            if any(name.endswith("ApiException") for name in names):
                importers.append(str(path.relative_to(PACKAGE)))
    assert importers == []
