"""Every error the API returns: a status code and
``{"error": {"code": 403, "reason": "Forbidden", "message": "..."}}``."""

from __future__ import annotations

import logging
from typing import Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from flowforge.kube.errors import KubernetesError

logger = logging.getLogger("flowforge.server")

REASONS: Final = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "BadRequest",
    409: "Conflict",
    413: "BadRequest",
    422: "BadRequest",
    503: "Unavailable",
}


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_response(status: int, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": 'Bearer realm="flowforge"'} if status == 401 else None
    # only the reasons of the contract: a 5xx the server did not mean is "Unavailable"
    reason = REASONS.get(status, "Unavailable" if status >= 500 else "BadRequest")
    return JSONResponse(
        {"error": {"code": status, "reason": reason, "message": message}},
        status_code=status,
        headers=headers,
    )


def _parameter(location: tuple[object, ...]) -> str:
    return ".".join(str(part) for part in location[1:]) or str(location[0])


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        return error_response(error.status, error.message)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = _parameter(tuple(first.get("loc") or ("request",)))
        return error_response(400, f"invalid parameter {where}: {first.get('msg', 'invalid')}")

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> JSONResponse:
        return error_response(error.status_code, str(error.detail))

    @app.exception_handler(KubernetesError)
    async def kubernetes(_: Request, error: KubernetesError) -> JSONResponse:
        # the apiserver's refusals of the caller keep their code; its failures are 503s
        status = error.status or 503
        if status >= 500 or error.retryable:
            status = 503
        return error_response(status, f"Kubernetes API: {error.message}")
