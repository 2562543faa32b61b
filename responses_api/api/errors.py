"""How the Conversations API answers errors (spec 2, Errors): ``{"error": <message string>}`` with the
status, except two structured errors, item_already_in_conversation and invalid_value
(``{"error": {message, type, param, code}}``). A missing or unknown key is 401 with an empty body; a
store outage is 503 with Retry-After. Anything else escapes to the gateway's 500 handler.
"""

from __future__ import annotations

from typing import Any, TypedDict

from django.http import HttpResponse
from rest_framework import exceptions
from rest_framework.response import Response

from responses_api.conversations import InvalidInclude, RequestError
from responses_api.storage.base import (
    ConversationNotFound,
    CursorNotFound,
    HistoryError,
    ItemAlreadyInConversation,
    ItemNotFound,
    ReferencedItemNotFound,
)
from responses_api.storage.db import STORE_ERRORS

__all__ = [
    "StructuredError",
    "message_error",
    "structured_error",
    "unauthorized",
    "exception_handler",
    "STORE_UNAVAILABLE",
    "RETRY_AFTER_SECS",
]

STORE_UNAVAILABLE = "The gateway's store is unavailable; try again shortly"
RETRY_AFTER_SECS = 5


class StructuredFields(TypedDict):
    message: str
    type: str
    param: str | None
    code: str


class StructuredError(TypedDict):
    error: StructuredFields


def message_error(status: int, message: str) -> Response:
    return Response({"error": message}, status=status)


def structured_error(status: int, message: str, param: str | None, code: str) -> Response:
    body: StructuredError = {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    }
    return Response(body, status=status)


def unauthorized() -> HttpResponse:
    response = HttpResponse(status=401)
    del response["Content-Type"]
    return response


def _history_error(exc: HistoryError) -> Response:
    if isinstance(exc, ItemAlreadyInConversation):
        return structured_error(400, "Item already in conversation", "items", "item_already_in_conversation")
    if isinstance(exc, ConversationNotFound):
        return message_error(404, "Conversation not found")
    if isinstance(exc, ItemNotFound):
        return message_error(404, "Item not found in this conversation")
    if isinstance(exc, (CursorNotFound, ReferencedItemNotFound)):
        return message_error(404, str(exc))
    return message_error(400, str(exc))  # MetadataLimitExceeded, HistoryFull


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | HttpResponse | None:
    """The conversation views' DRF exception handler. Its answers are not logged by Django (a client's
    mistake is not the gateway's warning; an outage is logged once by common.outages)."""
    response = _answer(exc, context)
    if response is not None:
        response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def _answer(exc: Exception, context: dict[str, Any]) -> Response | HttpResponse | None:
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        return unauthorized()
    if isinstance(exc, HistoryError):
        return _history_error(exc)
    if isinstance(exc, RequestError):
        return message_error(exc.status, exc.message)
    if isinstance(exc, InvalidInclude):
        return structured_error(400, str(exc), "include", "invalid_value")
    if isinstance(exc, STORE_ERRORS):  # reported to common.outages.STORE by the store
        response = message_error(503, STORE_UNAVAILABLE)
        response["Retry-After"] = str(RETRY_AFTER_SECS)
        return response
    if isinstance(exc, exceptions.MethodNotAllowed):
        return message_error(405, f"Method {context['request'].method} not allowed")
    if isinstance(exc, exceptions.APIException):
        return message_error(exc.status_code, str(exc.detail))
    return None
