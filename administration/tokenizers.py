"""The tokenizer registry (spec 3, /v1/tokenizers): add, look up, list and remove tokenizers.

One domain function per operation, called by the API views and the console. Adding writes a
pending row and queues its load job (administration/tokenizer_jobs.py) once the row commits. A
name is held by a pending, processing or completed row: adding it again is a conflict naming that
row. Lookups by name see completed tokenizers only; a queued, loading or failed job is found by its
id. A failed row is kept for its status about five minutes (``FAILED_RETENTION``), then it is gone:
every call here first deletes the expired ones (one indexed DELETE), after failing the loads whose
job is gone (``ABANDONED_AFTER`` without a write), so no name is held by a load nothing will end.
"""

from __future__ import annotations

import uuid

from django.db import IntegrityError, transaction
from django.db.models import Q

from administration.jobs import enqueue
from administration.models import RegisteredTokenizer, TokenizerStatus
from administration.notices import publish_registry_changed
from administration.tokenizer_jobs import ABANDONED_AFTER, abandoned_horizon, clock, expiry_horizon

__all__ = [
    "TokenizerConflict", "add_tokenizer", "find_tokenizer", "find_tokenizer_job", "list_tokenizers",
    "remove_tokenizer", "purge_expired_tokenizers",
]  # fmt: skip

LOAD_JOB = "load_tokenizer"


class TokenizerConflict(Exception):
    """The name is held by another tokenizer (``existing``: its id)."""

    def __init__(self, name: str, existing: uuid.UUID) -> None:
        super().__init__(f"A tokenizer named '{name}' already exists")
        self.existing = existing


def _as_uuid(key: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(key)
    except ValueError:
        return None


_ABANDONED_MINUTES = int(ABANDONED_AFTER.total_seconds() // 60)


def purge_expired_tokenizers() -> int:
    """Fail the abandoned loads, delete the failed rows older than the retention; how many went."""
    RegisteredTokenizer.objects.filter(
        status__in=[TokenizerStatus.PENDING, TokenizerStatus.PROCESSING], updated_at__lt=abandoned_horizon()
    ).update(
        status=TokenizerStatus.FAILED, updated_at=clock(),
        message=f"Failed to load the tokenizer: its job ended without a result (no progress for {_ABANDONED_MINUTES} min)",
    )
    deleted, _ = RegisteredTokenizer.objects.filter(status=TokenizerStatus.FAILED, updated_at__lt=expiry_horizon()).delete()
    return deleted


def add_tokenizer(name: str, source: str, chat_template_path: str | None = None) -> RegisteredTokenizer:
    """Register ``name`` as pending and queue its load. Raises :class:`TokenizerConflict`."""
    purge_expired_tokenizers()
    holder = RegisteredTokenizer.objects.filter(name=name).exclude(status=TokenizerStatus.FAILED)
    with transaction.atomic():
        existing = holder.values_list("pk", flat=True).first()
        if existing is not None:
            raise TokenizerConflict(name, existing)
        try:
            with transaction.atomic():
                row = RegisteredTokenizer.objects.create(
                    name=name, source=source, chat_template_path=chat_template_path or "", updated_at=clock(),
                    message="Tokenizer load queued",
                )
        except IntegrityError:  # added by another request since the check
            raced = holder.values_list("pk", flat=True).first()
            if raced is None:
                raise
            raise TokenizerConflict(name, raced) from None
        enqueue(LOAD_JOB, str(row.pk))
    return row


def _storable(key: str) -> bool:
    """Whether ``key`` can be compared with a stored name (Postgres refuses text holding NUL)."""
    return "\x00" not in key


def find_tokenizer(key: str) -> RegisteredTokenizer | None:
    """A completed tokenizer by id or name."""
    if not _storable(key):
        return None
    ready = RegisteredTokenizer.objects.filter(status=TokenizerStatus.COMPLETED)
    found = _as_uuid(key)
    by_id = ready.filter(pk=found).first() if found is not None else None
    return by_id or ready.filter(name=key).first()


def find_tokenizer_job(key: str) -> RegisteredTokenizer | None:
    """For the status route: a completed tokenizer by id or name, a queued, loading or failed one
    (within the retention) by its id only."""
    purge_expired_tokenizers()
    if not _storable(key):
        return None
    found = _as_uuid(key)
    if found is not None:
        row = RegisteredTokenizer.objects.filter(pk=found).first()
        if row is not None:
            return row
    return RegisteredTokenizer.objects.filter(status=TokenizerStatus.COMPLETED, name=key).first()


def list_tokenizers() -> list[RegisteredTokenizer]:
    """The loaded (completed) tokenizers, by name."""
    return list(RegisteredTokenizer.objects.filter(status=TokenizerStatus.COMPLETED).order_by("name"))


def remove_tokenizer(key: str) -> RegisteredTokenizer | None:
    """Remove a tokenizer by id (a pending, loading or failed one too: a job then finds nothing) or
    a completed one by name; None when there is none. Gateway processes drop it with their next
    registry reload."""
    purge_expired_tokenizers()
    if not _storable(key):
        return None
    found = _as_uuid(key)
    match = Q(pk=found) if found is not None else Q(pk__in=[])
    row = (
        RegisteredTokenizer.objects.filter(match).first()
        or RegisteredTokenizer.objects.filter(status=TokenizerStatus.COMPLETED, name=key).first()
    )
    if row is None:
        return None
    deleted, _ = RegisteredTokenizer.objects.filter(pk=row.pk).delete()
    if deleted and row.status == TokenizerStatus.COMPLETED:
        publish_registry_changed(None)
    return row if deleted else None
