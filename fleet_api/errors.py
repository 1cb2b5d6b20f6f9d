"""Every failure becomes ``{"error": {"code", "message"}}``, rendered here and nowhere else.

Routes only raise. ``FleetError`` subclasses carry their own code and status; FastAPI's validation
errors (bad JSON included), unknown routes and body limits are mapped here too; a database that
cannot be reached is a 503; anything else is a 500 that names a request id and never a stack trace.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException

from fleet_kernel.errors import ConflictError, FleetError

E = TypeVar("E", bound=Exception)

log = logging.getLogger("fleet_api")

# Exceptions that mean "the database is not there right now", not "this request is wrong".
STORE_DOWN: tuple[type[Exception], ...] = (
    OperationalError,
    InterfaceError,
    DisconnectionError,
    PoolTimeoutError,
    ConnectionError,
)
_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def error_response(
    status: int, code: str, message: str, *, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    """The one error body. ``extra`` adds fields beside code and message (e.g. a busy turn's id)."""
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status, headers=headers)


def _handler(
    kind: type[E], handle: Callable[[Request, E], JSONResponse]
) -> Callable[[Request, Exception], JSONResponse]:
    """``handle`` as Starlette's handler of ``kind``, which Starlette calls only with a ``kind`` (typed as any
    exception); anything else is raised on, to the last resort's 500."""

    def handler(request: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, kind):
            raise exc
        return handle(request, exc)

    return handler


def _fleet_error(_request: Request, exc: FleetError) -> JSONResponse:
    extra: dict[str, Any] = {}
    if isinstance(exc, ConflictError) and exc.turn_id:
        extra["turn_id"] = exc.turn_id
    retry = getattr(exc, "retry_after_s", None)  # a busy machine: when asking again may succeed
    headers = {"Retry-After": str(retry)} if retry else None
    return error_response(exc.status, exc.code, exc.message, headers=headers, **extra)


def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(422, "invalid_json", "the request body is not valid JSON")
    details = [{"loc": ".".join(str(p) for p in e.get("loc", ())), "message": str(e.get("msg", ""))} for e in errors]
    summary = "; ".join(f"{d['loc']}: {d['message']}" for d in details[:5]) or "invalid request"
    return error_response(422, "validation_error", summary, details=details[:20])


def _http_error(_request: Request, exc: HTTPException) -> JSONResponse:
    code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    if exc.status_code == 404 and message == "Not Found":
        message = "no such endpoint; the API is described at /api/openapi.json"
    return error_response(exc.status_code, code, message, headers=getattr(exc, "headers", None))


def _store_down(request: Request, exc: Exception) -> JSONResponse:
    log.warning("store unavailable during %s %s: %s", request.method, request.url.path, type(exc).__name__)
    return error_response(503, "store_unavailable", "the store is unavailable right now; retry shortly")


def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    request_id = uuid.uuid4().hex[:12]
    log.error("request %s (%s %s) failed", request_id, request.method, request.url.path, exc_info=exc)
    return error_response(
        500, "internal_error", f"an internal error occurred (request {request_id}); the server log has the details"
    )


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(FleetError, _handler(FleetError, _fleet_error))
    app.add_exception_handler(RequestValidationError, _handler(RequestValidationError, _validation_error))
    app.add_exception_handler(HTTPException, _handler(HTTPException, _http_error))
    for exc_type in STORE_DOWN:
        app.add_exception_handler(exc_type, _store_down)
    app.add_exception_handler(Exception, _internal_error)
