"""The ``flowforge server`` application: the API, its OpenAPI document, the UI's files, and
the bounds every request lives within."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

from fastapi import FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from fastapi.responses import PlainTextResponse

from flowforge import __version__
from flowforge.kube.probes import start_probe_server
from flowforge.server import definitions, models, routes, schedules, stream
from flowforge.server.errors import error_response, install_error_handlers
from flowforge.server.state import ServerState
from flowforge.server.static import SECURITY_HEADERS, STATIC_DIR, HashedAssets, ui_router

OPENAPI_PATH: Final = "/api/v1/openapi.json"
MAX_BODY_BYTES: Final = 64 * 1024
REQUEST_TIMEOUT_SECONDS: Final = 30.0


# Every POST carries this header (or a JSON body type): a cross-site form or `text/plain`
# fetch cannot add either without a CORS preflight, which this server never grants.
REQUEST_HEADER: Final = "x-flowforge-request"
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})


def cross_site_refusal(request: Request) -> Response | None:
    """A 403 for a state-changing request a browser could send from another site."""
    if request.method in SAFE_METHODS or REQUEST_HEADER in request.headers:
        return None
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        return None
    return error_response(
        403,
        f"a {request.method} must carry the header X-FlowForge-Request (or Content-Type: "
        "application/json); cross-site requests cannot",
    )


def create_app(
    state_factory: Callable[[], Awaitable[ServerState]],
    *,
    close: Callable[[ServerState], Awaitable[None]],
    static_dir: Path = STATIC_DIR,
    probe_address: tuple[str, int] | None = None,
) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = await state_factory()
        app.state.flowforge = state
        probes = None
        if probe_address is not None:
            host, port = probe_address
            probes = await start_probe_server(host=host, port=port, ready=lambda: True)
        try:
            yield
        finally:
            if probes is not None:
                probes.close()
            await close(state)

    app = FastAPI(
        title="FlowForge read API",
        version=__version__,
        description="Runs, their tasks, graphs, logs, actions and live changes, schedules and "
        "definitions, as "
        "Kubernetes lets the caller see them. Every /api/v1 request but this document "
        "carries `Authorization: Bearer <kubernetes token>`.",
        openapi_url=OPENAPI_PATH,
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    install_error_handlers(app)

    @app.middleware("http")
    async def bounded(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            response: Response = error_response(
                413, f"the request body is over {MAX_BODY_BYTES} bytes"
            )
        elif "transfer-encoding" in request.headers and request.method not in ("GET", "HEAD"):
            response = error_response(400, "send the request body with a Content-Length")
        elif (refusal := cross_site_refusal(request)) is not None:
            response = refusal
        else:
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
                    response = await call_next(request)
            except TimeoutError:
                response = error_response(503, f"no answer within {REQUEST_TIMEOUT_SECONDS:.0f} s")
        response.headers.update(SECURITY_HEADERS)
        return response

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok")

    app.include_router(routes.router)
    app.include_router(schedules.router)
    app.include_router(definitions.router)
    app.include_router(stream.router)
    assets = static_dir / "assets"
    app.mount("/assets", HashedAssets(directory=assets, check_dir=False), name="assets")
    app.include_router(ui_router(static_dir))
    app.openapi = lambda: openapi_document(app)  # type: ignore[method-assign]
    return app


def openapi_document(app: FastAPI) -> dict[str, Any]:
    """The generated document, with the stream's event data and the bearer scheme, and
    without FastAPI's 422 responses (this API answers a bad parameter with a 400)."""
    if app.openapi_schema:
        return app.openapi_schema
    document = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    change = models.RunChange.model_json_schema(
        by_alias=True, ref_template="#/components/schemas/{model}"
    )
    schemas.update(change.pop("$defs", {}))
    schemas["RunChange"] = change
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    app.openapi_schema = document
    return document
