"""The tokenizer load job (spec 3, the tokenizer registry): pending → processing → completed or
failed, each step a conditional UPDATE of the tokenizer's row. Sync; run by Celery or on a job
thread (administration/jobs.py), queued by administration/tokenizers.py.

The job fetches the source when it is not local (a hub id, a gRPC worker's GetTokenizer stream),
loads it once to check it (tokenizer.json, special tokens, the chat template compiles) and records
where it loaded from and its vocabulary size. A completed load is recorded as a registry change
that is not one worker's (administration/notices.py), so every gateway process reloads its registry
snapshot, tokenizers included (:func:`tokenizer_entries`), within about a second; each then loads
the tokenizer itself when a request first needs it.

Whatever fails in a load, in any step, ends it as failed (:func:`fail_tokenizer_load`, called by
administration/job_runner.py's wrapper), which frees the name; a source the job could never use (a
path component no file system holds) is refused at the request instead (administration/api/tokenizers.py).
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta

from django.utils import timezone

from administration.models import RegisteredTokenizer, TokenizerStatus, Worker
from administration.notices import publish_registry_changed
from inference.pipeline.tokenizer_registry import TokenizerEntry, tokenizer_work_dir
from inference.pipeline.tokenizer_sources import SourceKind, resolve_tokenizer_source, source_kind
from inference.pipeline.tokenizers import TokenizerLoadError, load_tokenizer

__all__ = [
    "FAILED_RETENTION", "ABANDONED_AFTER", "clock", "run_tokenizer_load", "fail_tokenizer_load", "tokenizer_entries",
    "expiry_horizon", "abandoned_horizon",
]

log = logging.getLogger(__name__)

FAILED_RETENTION = timedelta(minutes=5)
"""A failed load's status is kept this long (spec 3: about five minutes), then lookups give 404."""


ABANDONED_AFTER = timedelta(hours=1)
"""A load queued or running this long since its row last moved has no job left to end it (its
process died, the broker lost it): it is then failed, which frees its name. Far past what a load
takes (a worker's archive within 120 s, a store outage waited out within 10 min)."""


def clock() -> datetime:
    """Now, for the rows' timestamps and the failed rows' expiry (tests set another clock)."""
    return timezone.now()


def expiry_horizon() -> datetime:
    """Failed rows last written before this are gone."""
    return clock() - FAILED_RETENTION


def abandoned_horizon() -> datetime:
    """Pending or processing rows last written before this have no job left."""
    return clock() - ABANDONED_AFTER


def _worker_key(source: str) -> str | None:
    """The api_key of the registered worker at this URL, for a gRPC worker source."""
    if source_kind(source) is not SourceKind.WORKER:
        return None
    key = Worker.objects.filter(url=source.rstrip("/")).values_list("api_key", flat=True).first()
    return key or None


def run_tokenizer_load(tokenizer_id: str) -> None:
    """Load the tokenizer of this row; a row deleted meanwhile ends the job quietly."""
    started = RegisteredTokenizer.objects.filter(
        pk=tokenizer_id, status__in=[TokenizerStatus.PENDING, TokenizerStatus.PROCESSING]
    ).update(status=TokenizerStatus.PROCESSING, message="Loading the tokenizer", updated_at=clock())
    row = RegisteredTokenizer.objects.filter(pk=tokenizer_id).first() if started else None
    if row is None:
        log.info("tokenizer load %s skipped: removed or already finished", tokenizer_id)
        return
    api_key = _worker_key(row.source)
    try:
        location = resolve_tokenizer_source(row.source, work_dir=tokenizer_work_dir(), api_key=api_key)
        loaded = load_tokenizer(location, chat_template=row.chat_template_path or None)
    except TokenizerLoadError:
        raise
    except Exception as error:  # whatever a fetch or the files raise: the source did not load
        raise TokenizerLoadError(str(error) or type(error).__name__) from error
    completed = RegisteredTokenizer.objects.filter(pk=tokenizer_id, status=TokenizerStatus.PROCESSING).update(
        status=TokenizerStatus.COMPLETED,
        message=f"Tokenizer loaded ({loaded.vocab_size} tokens)",
        vocab_size=loaded.vocab_size,
        location=str(location),
        updated_at=clock(),
    )
    if completed:
        log.info("tokenizer %r loaded from %s (%d tokens)", row.name, row.source, loaded.vocab_size)
        publish_registry_changed(None)


def fail_tokenizer_load(tokenizer_id: str, message: str) -> None:
    """End a load as failed (its status kept for FAILED_RETENTION; the name is free at once). A row
    removed or finished meanwhile is left alone."""
    failed = RegisteredTokenizer.objects.filter(
        pk=tokenizer_id, status__in=[TokenizerStatus.PENDING, TokenizerStatus.PROCESSING]
    ).update(status=TokenizerStatus.FAILED, message=f"Failed to load the tokenizer: {message}", updated_at=clock())
    if failed:
        log.warning("tokenizer load %s failed: %s", tokenizer_id, message)


def tokenizer_entries() -> list[TokenizerEntry]:
    """The completed tokenizers as the data plane sees them (one read; the fleet loop's reload).
    A location the job fetched on another host is not here: the source is fetched again."""
    rows = RegisteredTokenizer.objects.filter(status=TokenizerStatus.COMPLETED).values_list(
        "id", "name", "source", "location", "chat_template_path", "vocab_size"
    )
    return [
        TokenizerEntry(
            id=str(row_id),
            name=name,
            location=location if location and os.path.exists(location) else source,
            chat_template=template or None,
            vocab_size=vocab_size,
        )
        for row_id, name, source, location, template, vocab_size in rows
    ]
