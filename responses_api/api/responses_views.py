"""GET and DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel and GET
/v1/responses/{id}/input_items (spec 2, Endpoints and the cancel row of States and transitions):
stored responses, in the caller's scope (another scope's response is unknown), answered in the
standard error envelope ``{error: {message, type, param, code}}``.
"""

from __future__ import annotations

from typing import Any, Callable

from django.http import HttpResponse
from rest_framework.request import Request
from rest_framework.response import Response

from inference.errors import GatewayError
from responses_api.api.errors import exception_handler
from responses_api.api.views import ConversationAPIView, _run
from responses_api.conversations import known_id
from responses_api.http_cancel import acancel_on_http_workers
from responses_api.storage import history_store
from responses_api.storage.base import ItemPage

__all__ = ["ResponseView", "ResponseCancelView", "ResponseInputItemsView"]


def _not_found(response_id: str, code: str = "not_found") -> GatewayError:
    return GatewayError(404, code, f"Response with id '{response_id}' not found.", param="response_id")


def _handle(error: Exception, context: dict[str, Any]) -> HttpResponse | None:
    if isinstance(error, GatewayError):
        return Response(error.to_dict(), status=error.status, headers={"X-GW-Error-Code": str(error.code)})
    return exception_handler(error, context)


class _ResponseAPIView(ConversationAPIView):
    def get_exception_handler(self) -> Callable[..., Any]:
        return _handle

    def stored(self, request: Request, response_id: str, code: str = "not_found") -> dict[str, Any]:
        found = _run(history_store().aget_response, self.scope(request), response_id) if known_id(response_id) else None
        if found is None:
            raise _not_found(response_id, code)
        return found


class ResponseView(_ResponseAPIView):
    """GET and DELETE /v1/responses/{response_id}"""

    def get(self, request: Request, response_id: str) -> Response:
        return Response(self.stored(request, response_id))

    def delete(self, request: Request, response_id: str) -> Response:
        if not known_id(response_id) or not _run(history_store().adelete_response, self.scope(request), response_id):
            raise _not_found(response_id)
        return Response({"id": response_id, "object": "response.deleted", "deleted": True})


class ResponseCancelView(_ResponseAPIView):
    """POST /v1/responses/{response_id}/cancel (a response the gateway does not have is asked of
    the HTTP workers, which keep their own)"""

    def post(self, request: Request, response_id: str) -> HttpResponse:
        found = _run(history_store().aget_response, self.scope(request), response_id) if known_id(response_id) else None
        if found is None:  # perhaps an HTTP worker's own response: the gateway asks them
            relayed = _run(acancel_on_http_workers, response_id)
            if relayed is not None:
                return HttpResponse(relayed.body, status=relayed.status, content_type=relayed.content_type)
            raise _not_found(response_id, "response_not_found")
        stored = found
        status = stored.get("status")
        if status == "cancelled":
            return Response(stored)
        if not stored.get("background"):
            raise GatewayError(
                400, "cancellation_not_supported", "Only responses created with background: true can be cancelled."
            )
        if status in ("completed", "incomplete"):
            raise GatewayError(400, "response_already_completed", "The response has already completed.")
        if status == "failed":
            raise GatewayError(400, "response_already_failed", "The response has already failed.")
        scope = self.scope(request)
        _run(history_store().aset_response_status, scope, response_id, "cancelled", only_from=("queued", "in_progress"))
        return Response(self.stored(request, response_id, "response_not_found"))


class ResponseInputItemsView(_ResponseAPIView):
    """GET /v1/responses/{response_id}/input_items: every input item in one page (has_more false)."""

    def get(self, request: Request, response_id: str) -> Response:
        items = _run(history_store().alist_input_items, self.scope(request), response_id) if known_id(response_id) else None
        if items is None:
            raise _not_found(response_id)
        return Response(ItemPage(items).to_object())
