"""The read API's OpenAPI document (generated from the pydantic models the responses are made
of) is the one committed as docs/openapi.json, and names every endpoint of docs/api.md."""

from __future__ import annotations

import json
from pathlib import Path

from flowforge.server.app import create_app, openapi_document
from flowforge.server.state import ServerState

DOCUMENT = Path(__file__).parents[2] / "docs" / "openapi.json"
REGENERATE = (
    "python -c 'import json; from tests.unit.test_server_api_document import generated; "
    "print(json.dumps(generated(), indent=2, sort_keys=True))' > docs/openapi.json"
)


async def _never() -> ServerState:
    raise AssertionError("the document needs no running server")


async def _close(_: ServerState) -> None:
    return None


def generated() -> dict[str, object]:
    return openapi_document(create_app(_never, close=_close))


def test_the_committed_document_is_the_generated_one() -> None:
    assert json.loads(DOCUMENT.read_text()) == generated(), f"regenerate it: {REGENERATE}"


def test_it_documents_every_endpoint_of_the_contract_and_no_422() -> None:
    document = generated()
    paths = document["paths"]
    assert isinstance(paths, dict)
    base = "/api/v1/namespaces/{namespace}"
    assert set(paths) == {
        "/api/v1/whoami",
        "/api/v1/namespaces",
        "/api/v1/runs",
        f"{base}/runs/{{name}}",
        f"{base}/runs/{{name}}/graph",
        f"{base}/runs/{{name}}/tasks/{{task}}",
        f"{base}/runs/{{name}}/tasks/{{task}}/attempts/{{number}}/log",
        f"{base}/runs/{{name}}/stream",
        f"{base}/runs/{{name}}/cancel",
        f"{base}/runs/{{name}}/retry",
        f"{base}/runs/{{name}}/actions",
        f"{base}/schedules",
        f"{base}/schedules/{{name}}",
        f"{base}/definitions",
        f"{base}/definitions/{{name}}",
    }
    text = json.dumps(document)
    assert '"422"' not in text and "HTTPValidationError" not in text
    schemas = document["components"]["schemas"]  # type: ignore[index]
    run = schemas["RunSummary"]["properties"]
    assert {"createdAt", "durationSeconds", "queue", "progress"} <= set(run)
    assert "continue" in schemas["RunList"]["properties"]
    assert document["components"]["securitySchemes"]  # type: ignore[index]
