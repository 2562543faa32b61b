"""The control plane's error envelope (spec 3, Errors) and DRF's exception handler.

Authentication and permission failures become ``{"error": {"message", "type"}}`` with type
``unauthorized`` (401) or ``forbidden`` (403); everything else is left to DRF's default handler. The
worker endpoints answer ``{error, code}`` bodies (:func:`worker_error_body`). A store outage on any
control route is answered 503 by administration/store_outage.py.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, TypedDict

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from rest_framework import exceptions  # type: ignore[import-untyped, unused-ignore]
from rest_framework.response import Response  # type: ignore[import-untyped, unused-ignore]
from rest_framework.views import exception_handler as drf_exception_handler  # type: ignore[import-untyped, unused-ignore]

__all__ = ["ErrorType", "ErrorBody", "error_body", "WorkerErrorBody", "worker_error_body", "exception_handler"]


class ErrorType(StrEnum):
    """The ``type`` of the general admin error body, by status."""

    BAD_REQUEST = "bad_request"  # 400
    UNAUTHORIZED = "unauthorized"  # 401
    FORBIDDEN = "forbidden"  # 403
    NOT_FOUND = "not_found"  # 404
    CONFLICT = "conflict"  # 409
    SERVICE_UNAVAILABLE = "service_unavailable"  # 503


class ErrorFields(TypedDict):
    message: str
    type: str


class ErrorBody(TypedDict):
    error: ErrorFields


def error_body(message: str, error_type: ErrorType | str) -> ErrorBody:
    return {"error": {"message": message, "type": str(error_type)}}


class WorkerErrorBody(TypedDict):
    error: str
    code: str


def worker_error_body(message: str, code: str) -> WorkerErrorBody:
    """The worker endpoints' body (spec 3, Errors): ``{"error": <message>, "code": <CODE>}``."""
    return {"error": message, "code": code}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """REST_FRAMEWORK["EXCEPTION_HANDLER"]: 401 / 403 in the admin envelope, the rest as DRF does."""
    if isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(*exc.args)
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed, exceptions.PermissionDenied)):
        # DRF turns a 401 into 403 when the view has no authenticator giving a WWW-Authenticate header.
        status = 401 if exc.status_code == 401 else 403
        error_type = ErrorType.UNAUTHORIZED if status == 401 else ErrorType.FORBIDDEN
        auth_header = getattr(exc, "auth_header", None)  # set by APIView.handle_exception
        headers = {"WWW-Authenticate": auth_header} if auth_header else None
        return Response(error_body(str(exc.detail), error_type), status=status, headers=headers)
    response: Response | None = drf_exception_handler(exc, context)
    return response
