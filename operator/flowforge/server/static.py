"""The web UI's files (``static/``, filled by the UI's reproducible build and shipped as package
data): hashed files under ``/assets/`` cached for a year, ``index.html`` for every other
path that is not the API (client-side routes such as ``/runs/ns/name``), never cached."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, PlainTextResponse, Response
from starlette.staticfiles import StaticFiles

from flowforge.server.errors import error_response

STATIC_DIR: Final = Path(__file__).parent / "static"
IMMUTABLE: Final = "public, max-age=31536000, immutable"
# the UI loads nothing from elsewhere and runs no inline script
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "font-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


class HashedAssets(StaticFiles):
    """``/assets/``: names carry a content hash, so a file never changes under its name."""

    def file_response(self, *args: object, **kwargs: object) -> Response:
        response = super().file_response(*args, **kwargs)  # type: ignore[arg-type]
        response.headers["Cache-Control"] = IMMUTABLE
        return response


def ui_router(directory: Path = STATIC_DIR) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    root = directory.resolve()

    @router.get("/{path:path}")
    async def ui(path: str, request: Request) -> Response:
        if path == "api" or path.startswith("api/"):
            return error_response(404, f"no such API path: /{path}")
        candidate = (root / path).resolve()
        if path and candidate.is_file() and candidate.is_relative_to(root):
            return FileResponse(candidate, headers={"Cache-Control": "no-cache"})
        index = root / "index.html"
        if not index.is_file():
            return PlainTextResponse(
                "the web UI is not built into this installation (the API is at /api/v1)",
                status_code=404,
            )
        return FileResponse(index, headers={"Cache-Control": "no-cache"})

    return router
