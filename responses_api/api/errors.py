"""How the Conversations API answers errors (spec 2, Errors): ``{"error": <message string>}`` with the
status, except two structured errors, item_already_in_conversation and invalid_value
(``{"error": {message, type, param, code}}``). A missing or unknown key is 401 with an empty body; a
store outage is 503 with Retry-After. Anything else escapes to the gateway's 500 handler.

The gateway's own refusals on the store's client routes (a store outage, a tenant over its rate
limit) are :class:`~inference.errors.GatewayError` answered by :func:`refusal` in the route family's
format: the conversation routes' message body, the stored responses' standard envelope.
"""

from __future__ import annotations

from typing import Any, TypedDict

from django.http import HttpResponse, JsonResponse
from rest_framework import exceptions
from rest_framework.response import Response

from inference.errors import GatewayError
from responses_api.conversations import InvalidInclude, RequestError
from responses_api.storage.base import (
    ConversationNotFound,
    CursorNotFound,
    HistoryError,
    ItemAlreadyInConversation,
    ItemNotFound,
    ReferencedItemNotFound,
)
from common.db import STORE_ERRORS

__all__ = [
    "StructuredError",
    "message_error",
    "structured_error",
    "unauthorized",
    "exception_handler",
    "STORE_UNAVAILABLE",
    "RETRY_AFTER_SECS",
    "refusal",
    "store_unavailable",
]

STORE_UNAVAILABLE = "The gateway's store is unavailable; try again shortly"
RETRY_AFTER_SECS = 5
CONVERSATION_ROUTES = "/v1/conversations"  # the routes whose errors are {"error": <message string>}


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


def store_unavailable() -> GatewayError:
    """503 while the store cannot be reached (spec 2 gives the type and no code: the code is the type)."""
    return GatewayError(503, "service_unavailable", STORE_UNAVAILABLE,
                        headers=((b"retry-after", str(RETRY_AFTER_SECS).encode()),))  # fmt: skip


def refusal(path: str, error: GatewayError) -> HttpResponse:
    """``error`` answered in the format of ``path``'s route family, with its headers: a conversation
    route's ``{"error": <message>}``, else the standard envelope with X-GW-Error-Code. Not logged by
    Django (a client's limit is not the gateway's warning; an outage is logged once by common.outages)."""
    if path.startswith(CONVERSATION_ROUTES):
        response = JsonResponse({"error": error.message}, status=error.status)
    else:
        response = JsonResponse(error.to_dict(), status=error.status)
        response["X-GW-Error-Code"] = str(error.code)
    for name, value in error.headers:
        response[name.decode("latin-1")] = value.decode("latin-1")
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


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
        return refusal(context["request"].path, store_unavailable())
    if isinstance(exc, exceptions.MethodNotAllowed):
        return message_error(405, f"Method {context['request'].method} not allowed")
    if isinstance(exc, exceptions.APIException):
        return message_error(exc.status_code, str(exc.detail))
    return None
