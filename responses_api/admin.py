"""Stored responses and conversations in the admin console (staff login at /admin/): browsable and
searchable, read-only. Rows are written by the Responses and Conversations APIs through the db history
backend and removed by their DELETE routes or ``manage.py purge_history``; the console never edits them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from responses_api.models import Conversation, ConversationItem, ItemKind, ResponseItem, StoredResponse
from responses_api.transcript import render_transcript, transcript

__all__ = ["StoredResponseAdmin", "ConversationAdmin"]

_EMPTY = "—"
_PREVIEW = 120  # characters of an item shown in a list row

if TYPE_CHECKING:
    _ResponseModelAdmin = admin.ModelAdmin[StoredResponse]
    _ConversationModelAdmin = admin.ModelAdmin[Conversation]
    _ResponseItemInline = admin.TabularInline[ResponseItem, StoredResponse]
    _ConversationItemInline = admin.TabularInline[ConversationItem, Conversation]
else:  # generic only in django-stubs
    _ResponseModelAdmin = _ConversationModelAdmin = admin.ModelAdmin
    _ResponseItemInline = _ConversationItemInline = admin.TabularInline


def _json(value: Any) -> SafeString:
    return format_html('<pre class="gw-spec">{}</pre>', json.dumps(value, indent=2, ensure_ascii=False))


def _raw_json(value: Any) -> SafeString:
    """The JSON a click away: folded in a <details> element."""
    return format_html('<details class="gw-raw"><summary>Raw JSON</summary>{}</details>', _json(value))


def _preview(body: Any) -> str:
    text = json.dumps(body.get("content", body) if isinstance(body, dict) else body, ensure_ascii=False)
    return text if len(text) <= _PREVIEW else text[: _PREVIEW - 1] + "…"


class ReadOnly:
    """Browse only: no add, change or delete from the console (views still need the view permission)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ResponseItemInline(ReadOnly, _ResponseItemInline):
    model = ResponseItem
    fields = ("kind", "position", "item_id", "item_type", "item_body")
    readonly_fields = ("kind", "position", "item_id", "item_type", "item_body")
    extra = 0
    can_delete = False
    verbose_name = "item"
    verbose_name_plural = "Input and output items"

    def get_queryset(self, request: HttpRequest) -> QuerySet[ResponseItem]:
        return super().get_queryset(request).select_related("item")

    @admin.display(description="Item id")
    def item_id(self, link: ResponseItem) -> str:
        return link.item.item_id

    @admin.display(description="Type")
    def item_type(self, link: ResponseItem) -> str:
        return link.item.type

    @admin.display(description="Item")
    def item_body(self, link: ResponseItem) -> SafeString:
        return _raw_json(link.item.body)


@admin.register(StoredResponse)
class StoredResponseAdmin(ReadOnly, _ResponseModelAdmin):
    list_display = ["id", "scope", "model", "status", "background", "conversation_id", "created_at", "updated_at"]
    list_filter = ["scope", "model", "status", "background", "created_at"]
    search_fields = ["=id", "=previous_response_id", "=conversation_id"]
    search_help_text = "Search by response id, previous response id or conversation id (exact)."
    date_hierarchy = "created_at"
    empty_value_display = _EMPTY
    show_full_result_count = False  # no COUNT(*) over the whole table on each page
    fields = ["id", "scope", ("model", "status"), ("background", "store"), "previous_response_id", "conversation_id",
              ("created_at", "updated_at"), "conversation", "response_object"]
    readonly_fields = ["id", "scope", "model", "status", "background", "store", "previous_response_id",
                       "conversation_id", "created_at", "updated_at", "conversation", "response_object"]
    inlines = [ResponseItemInline]

    @admin.display(description="Conversation (instructions, input, then output)")
    def conversation(self, row: StoredResponse) -> SafeString:
        links = sorted(row.item_links.select_related("item"), key=lambda link: (link.kind != ItemKind.INPUT, link.position))
        instructions = row.body.get("instructions") if isinstance(row.body, dict) else None
        return render_transcript(transcript(((link.kind, link.item) for link in links), instructions))

    @admin.display(description="Response object (as stored; the status column is current)")
    def response_object(self, row: StoredResponse) -> SafeString:
        return _raw_json(row.body)


class ConversationItemInline(ReadOnly, _ConversationItemInline):
    model = ConversationItem
    fields = ("item_id", "item_type", "role", "deleted", "added_at", "preview")
    readonly_fields = ("item_id", "item_type", "role", "deleted", "added_at", "preview")
    extra = 0
    can_delete = False
    verbose_name = "item"
    verbose_name_plural = "Items (oldest first; deleted ones are kept, marked)"

    def get_queryset(self, request: HttpRequest) -> QuerySet[ConversationItem]:
        return super().get_queryset(request).select_related("item").order_by("pk")

    @admin.display(description="Item id")
    def item_id(self, member: ConversationItem) -> str:
        return member.item.item_id

    @admin.display(description="Type")
    def item_type(self, member: ConversationItem) -> str:
        return member.item.type

    @admin.display(description="Role")
    def role(self, member: ConversationItem) -> str:
        return member.item.role or _EMPTY

    @admin.display(description="Content")
    def preview(self, member: ConversationItem) -> str:
        return _preview(member.item.body)


@admin.register(Conversation)
class ConversationAdmin(ReadOnly, _ConversationModelAdmin):
    list_display = ["id", "scope", "item_count", "created_at", "updated_at"]
    list_filter = ["scope", "created_at", "updated_at"]
    search_fields = ["=id"]
    search_help_text = "Search by conversation id (exact)."
    date_hierarchy = "created_at"
    empty_value_display = _EMPTY
    show_full_result_count = False
    fields = ["id", "scope", ("created_at", "updated_at"), "metadata_json", "conversation"]
    readonly_fields = ["id", "scope", "created_at", "updated_at", "metadata_json", "conversation"]
    inlines = [ConversationItemInline]

    @admin.display(description="Conversation (its items in order; deleted ones are left out)")
    def conversation(self, row: Conversation) -> SafeString:
        members = row.memberships.filter(deleted=False).select_related("item").order_by("pk")
        return render_transcript(transcript(("", member.item) for member in members))

    def get_queryset(self, request: HttpRequest) -> QuerySet[Conversation]:
        items = Count("memberships", filter=Q(memberships__deleted=False))
        return super().get_queryset(request).annotate(item_count=items)

    @admin.display(description="Items", ordering="item_count")
    def item_count(self, row: Conversation) -> int:
        return int(getattr(row, "item_count", 0))

    @admin.display(description="Metadata")
    def metadata_json(self, row: Conversation) -> SafeString:
        return _json(row.metadata or {})
