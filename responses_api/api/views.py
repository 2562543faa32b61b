"""The Conversations API (spec 2, Endpoints): DRF adapters. Each view authenticates the caller with the
data plane's keys, reads its input (responses_api/conversations.py), makes one call to the history
store in the caller's scope and renders the answer; refusals are raised and answered by
responses_api/api/errors.py.

DRF views are sync: Django runs each in its request's own thread and the store's coroutine is run
from there (the db backend then works on a worker thread, the memory backend on the event loop).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, TypeVar

from asgiref.sync import async_to_sync
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.config import current_config
from inference.auth import Identity
from responses_api.api.auth import ClientKeyAuthentication
from responses_api.api.errors import exception_handler
from responses_api.conversations import (
    RequestError,
    known_id,
    read_create,
    read_include,
    read_items,
    read_list_query,
    read_update,
)
from responses_api.limits import ITEM_ID_MAX
from responses_api.scope import scope_of
from responses_api.storage import history_store
from responses_api.storage.base import ConversationNotFound, CursorNotFound, ItemNotFound, ItemPage

__all__ = ["ConversationsView", "ConversationView", "ConversationItemsView", "ConversationItemView"]

T = TypeVar("T")


class JSONOnly(BaseContentNegotiation):
    """Always JSON, whatever the Accept header asks (never 406)."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: Any, format_suffix: str | None = None) -> tuple[BaseRenderer, str]:
        return (renderers[0], renderers[0].media_type)


def _run(call: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    return async_to_sync(call)(*args, **kwargs)


def _body(request: Request) -> bytes:
    """The raw body, at most --max-payload-size bytes (413 beyond)."""
    limit = current_config().max_payload_size
    raw = request._request.read(limit + 1)
    if len(raw) > limit:
        raise RequestError(f"Request body is larger than {limit} bytes", status=413)
    return raw


def _include(request: Request) -> list[str]:
    query = request.query_params
    return read_include([*query.getlist("include"), *query.getlist("include[]")])


def _conversation_id(value: str) -> str:
    if not known_id(value):
        raise ConversationNotFound(value)
    return value


def _item_id(value: str) -> str:
    if not known_id(value, ITEM_ID_MAX):
        raise ItemNotFound(value)
    return value


class ConversationAPIView(APIView):
    authentication_classes = [ClientKeyAuthentication]
    permission_classes: list[Any] = []
    renderer_classes = [JSONRenderer]
    content_negotiation_class = JSONOnly
    throttle_classes: list[Any] = []
    metadata_class = None  # OPTIONS is 405 like any other method a route does not serve
    schema = None  # client routes: not in the control plane's /openapi.json

    def get_exception_handler(self) -> Callable[..., Any]:
        return exception_handler

    def scope(self, request: Request) -> str:
        identity: Identity = request.user  # type: ignore[assignment]
        return scope_of(identity)


class ConversationsView(ConversationAPIView):
    """POST /v1/conversations"""

    def post(self, request: Request) -> Response:
        created = read_create(_body(request))
        record = _run(history_store().acreate_conversation, self.scope(request), created.metadata, created.items)
        return Response(record.to_object())


class ConversationView(ConversationAPIView):
    """GET, POST (update metadata) and DELETE /v1/conversations/{conversation_id}"""

    def get(self, request: Request, conversation_id: str) -> Response:
        record = _run(history_store().aget_conversation, self.scope(request), _conversation_id(conversation_id))
        if record is None:
            raise ConversationNotFound(conversation_id)
        return Response(record.to_object())

    def post(self, request: Request, conversation_id: str) -> Response:
        changes = read_update(_body(request))
        scope = self.scope(request)
        record = _run(history_store().aupdate_conversation, scope, _conversation_id(conversation_id), changes)
        if record is None:
            raise ConversationNotFound(conversation_id)
        return Response(record.to_object())

    def delete(self, request: Request, conversation_id: str) -> Response:
        if not _run(history_store().adelete_conversation, self.scope(request), _conversation_id(conversation_id)):
            raise ConversationNotFound(conversation_id)
        return Response({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


class ConversationItemsView(ConversationAPIView):
    """GET (list) and POST (create) /v1/conversations/{conversation_id}/items"""

    def get(self, request: Request, conversation_id: str) -> Response:
        query = read_list_query(request.query_params)
        _include(request)
        conversation_id = _conversation_id(conversation_id)
        if query.after is not None and not known_id(query.after, ITEM_ID_MAX):
            raise CursorNotFound(query.after)
        page = _run(
            history_store().alist_items,
            self.scope(request),
            conversation_id,
            limit=query.limit,
            order=query.order,
            after=query.after,
        )
        return Response(page.to_object())

    def post(self, request: Request, conversation_id: str) -> Response:
        _include(request)
        items = read_items(_body(request))
        created = _run(history_store().aadd_items, self.scope(request), _conversation_id(conversation_id), items)
        return Response(ItemPage(created).to_object())


class ConversationItemView(ConversationAPIView):
    """GET and DELETE /v1/conversations/{conversation_id}/items/{item_id}"""

    def get(self, request: Request, conversation_id: str, item_id: str) -> Response:
        _include(request)
        scope = self.scope(request)
        item = _run(history_store().aget_item, scope, _conversation_id(conversation_id), _item_id(item_id))
        return Response(item)

    def delete(self, request: Request, conversation_id: str, item_id: str) -> Response:
        scope = self.scope(request)
        record = _run(history_store().adelete_item, scope, _conversation_id(conversation_id), _item_id(item_id))
        return Response(record.to_object())
