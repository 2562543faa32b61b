"""Stored responses and conversations (spec 2), written by the db history backend
(responses_api/storage/db.py) and browsed read-only in the admin console.

Every row carries its tenant scope (responses_api/scope.py); each read filters on it, so another
tenant's record is as unknown as one never stored. Items (messages, function calls, MCP calls, ...)
are rows of their own, shared by the responses that used them (input or output) and the
conversations that hold them; an item id is unique within a scope. Removing an item from a
conversation is soft: its membership row is marked deleted and the item stays while anything
refers to it.
"""

from __future__ import annotations

from django.db import models

from responses_api.limits import ITEM_ID_MAX, OBJECT_ID_MAX, SCOPE_MAX

__all__ = [
    "ResponseStatus",
    "StoredResponse",
    "Item",
    "ItemKind",
    "ResponseItem",
    "Conversation",
    "ConversationItem",
    "item_label",
]


class ResponseStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    IN_PROGRESS = "in_progress", "In progress"
    COMPLETED = "completed", "Completed"
    INCOMPLETE = "incomplete", "Incomplete"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class StoredResponse(models.Model):
    """One response: the full object as last written, with the columns the console and the API filter
    on. The ``status`` column is authoritative (a cancel updates it alone); reads overlay it."""

    id = models.CharField(primary_key=True, max_length=OBJECT_ID_MAX)
    scope = models.CharField(max_length=SCOPE_MAX)
    model = models.CharField(max_length=512)
    status = models.CharField(max_length=16, choices=ResponseStatus.choices)
    background = models.BooleanField(default=False)
    store = models.BooleanField(default=True)
    previous_response_id = models.CharField(max_length=OBJECT_ID_MAX, blank=True, default="", db_index=True)
    conversation_id = models.CharField(max_length=OBJECT_ID_MAX, blank=True, default="", db_index=True)
    body = models.JSONField()
    created_at = models.DateTimeField(db_index=True)
    updated_at = models.DateTimeField(db_index=True)  # the last write: retention counts from it

    class Meta:
        verbose_name = "response"
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["scope", "-created_at"], name="resp_scope_created"),
            models.Index(fields=["status"], name="resp_status"),
            models.Index(fields=["model"], name="resp_model"),
        ]

    def __str__(self) -> str:
        return self.id


class Item(models.Model):
    """One item as answered to clients (``body`` holds its id and type), unique by id in its scope."""

    scope = models.CharField(max_length=SCOPE_MAX)
    item_id = models.CharField(max_length=ITEM_ID_MAX)
    type = models.CharField(max_length=64)
    role = models.CharField(max_length=32, blank=True, default="")
    status = models.CharField(max_length=32, blank=True, default="")
    body = models.JSONField()
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "item_id"], name="item_unique_in_scope")]

    def __str__(self) -> str:
        return item_label(self.type, self.role, self.item_id)


def item_label(item_type: str, role: str, item_id: str) -> str:
    """How the console names an item: its type, its role when it has one, and its id, such as
    "message · user · msg_abc" or "function_call · fc_123"."""
    return " · ".join(part for part in (item_type, role, item_id) if part)


class ItemKind(models.TextChoices):
    INPUT = "input", "Input"
    OUTPUT = "output", "Output"


class ResponseItem(models.Model):
    """An item of a response's input or output, at its position."""

    response = models.ForeignKey(StoredResponse, on_delete=models.CASCADE, related_name="item_links")
    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="response_links")
    kind = models.CharField(max_length=8, choices=ItemKind.choices)
    position = models.PositiveIntegerField()

    class Meta:
        ordering = ["response", "kind", "position"]
        constraints = [
            models.UniqueConstraint(fields=["response", "kind", "position"], name="response_item_position")
        ]

    def __str__(self) -> str:
        return str(self.item)


class Conversation(models.Model):
    id = models.CharField(primary_key=True, max_length=OBJECT_ID_MAX)
    scope = models.CharField(max_length=SCOPE_MAX)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_index=True)
    updated_at = models.DateTimeField(db_index=True)  # last activity: metadata, items, responses

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["scope", "-created_at"], name="conv_scope_created")]

    def __str__(self) -> str:
        return self.id


class ConversationItem(models.Model):
    """An item's membership of a conversation; the primary key orders a conversation's items.
    Deleting the item from the conversation marks the row deleted (the item itself persists)."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="memberships")
    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="conversation_links")
    deleted = models.BooleanField(default=False)
    added_at = models.DateTimeField()
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "conversation item"
        ordering = ["conversation", "id"]
        constraints = [
            models.UniqueConstraint(fields=["conversation", "item"], name="conversation_item_once")
        ]
        indexes = [models.Index(fields=["conversation", "deleted", "id"], name="conv_item_page")]

    def __str__(self) -> str:
        return f"{self.item} (deleted)" if self.deleted else str(self.item)
