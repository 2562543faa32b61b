"""Retention of stored responses and conversations (``--history-retention-days``, default 30; 0 keeps
them forever): ``manage.py purge_history`` deletes the responses not written for that long (with their
input and output links), the conversations with no activity for that long (metadata changes, items
added or deleted, responses appended count as activity), and then every item nothing holds any more.
Whatever the retention, it also deletes the results of ``store: false`` background responses ended
more than about ten minutes ago that a stopped process did not get to delete (spec 2).
Only the db backend is purged (the memory backend is bounded by itself)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from responses_api.background import UNSTORED_KEEP_SECS
from responses_api.models import Conversation, ResponseStatus, StoredResponse
from responses_api.storage.db import purge_orphan_items

__all__ = ["PurgeCounts", "purge_history", "purge_unstored", "retention_cutoff"]

_TERMINAL = (ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE, ResponseStatus.FAILED, ResponseStatus.CANCELLED)


@dataclass(frozen=True, slots=True)
class PurgeCounts:
    responses: int
    conversations: int
    items: int


def retention_cutoff(days: int, now: datetime | None = None) -> datetime | None:
    """The moment before which records are purged, or None when they are kept forever (0 days)."""
    if days <= 0:
        return None
    return (now or timezone.now()) - timedelta(days=days)


def purge_history(cutoff: datetime) -> PurgeCounts:
    """Delete responses and conversations idle since before ``cutoff``, then the orphaned items."""
    with transaction.atomic():
        responses = StoredResponse.objects.filter(updated_at__lt=cutoff).delete()[1].get(StoredResponse._meta.label, 0)
        conversations = Conversation.objects.filter(updated_at__lt=cutoff).delete()[1].get(Conversation._meta.label, 0)
        items = purge_orphan_items()
    return PurgeCounts(responses, conversations, items)


def purge_unstored(now: datetime | None = None) -> int:
    """Delete the unstored background results that ended more than :data:`UNSTORED_KEEP_SECS` ago."""
    cutoff = (now or timezone.now()) - timedelta(seconds=UNSTORED_KEEP_SECS)
    with transaction.atomic():
        found = StoredResponse.objects.filter(store=False, status__in=_TERMINAL, updated_at__lt=cutoff)
        deleted = found.delete()[1].get(StoredResponse._meta.label, 0)
        purge_orphan_items()
    return deleted
