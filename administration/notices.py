"""'The worker registry changed': tell every gateway process which workers to re-read.

The store is the record: every committed change adds a :class:`~administration.models.RegistryChange`
row naming the worker it touched (none for a change that is not one worker's, such as tenant
limits). Every gateway process reads the rows past the last one it applied twice a second
(``changes_since``) and re-reads only those workers, wherever the change was made (API, console,
command, Celery job, another gateway on the store). Two shortcuts make it sooner:

- this process's own listeners are called directly;
- with Redis, the Channels layer group ``gateway.registry`` tells the others at once.

Both carry the change (:class:`Notice`: its number in the log and the worker it touched), so a
process whose log is applied up to the number before it re-reads just that worker without reading
the log; a notice that does not follow on (one lost, a change made elsewhere) sends the process to
the log, and a garbled one to a full reload. Each gateway also reloads the whole fleet on a slow
timer, so a lost change delays it but never loses it.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta
from typing import Any, Callable, NamedTuple, Sequence
from uuid import UUID

from asgiref.sync import async_to_sync
from channels.layers import BaseChannelLayer, get_channel_layer
from django.conf import settings
from django.db import connections, router
from django.utils import timezone

from common.db import STORE_ERRORS
from administration.models import RegistryChange
from common.outages import REDIS, STORE

__all__ = [
    "GROUP", "CHANGE_RETENTION", "Notice", "Listener", "notice_message", "parse_notice", "publish_registry_changed",
    "publish_registry_changes", "record_change", "latest_change", "changes_since", "prune_changes", "add_local_listener", "remove_local_listener",
]

log = logging.getLogger(__name__)

GROUP = "gateway.registry"
_MESSAGE_TYPE = "registry.changed"


class Notice(NamedTuple):
    """One committed change as a notice carries it: its number in the store's change log (None when
    the store could not record it: read the log once it answers) and the worker it touched (None:
    not one worker's change, the whole fleet is read)."""

    seq: int | None
    worker_id: str | None


Listener = Callable[[Notice], None]
_listeners: list[Listener] = []
_lock = threading.Lock()


def notice_message(notice: Notice) -> dict[str, Any]:
    """The notice as the channel layer carries it."""
    return {"type": _MESSAGE_TYPE, "seq": notice.seq, "worker": notice.worker_id}


def parse_notice(message: Any) -> Notice | None:
    """The notice a channel-layer message carries; None when it is garbled. A message without a
    number (a gateway of an earlier version on the same Redis) is a notice to read the log."""
    if not isinstance(message, dict) or message.get("type") != _MESSAGE_TYPE:
        return None
    seq, worker_id = message.get("seq"), message.get("worker")
    if not (seq is None or (isinstance(seq, int) and not isinstance(seq, bool) and seq > 0)):
        return None
    if worker_id is not None:
        try:
            worker_id = str(UUID(worker_id))
        except (TypeError, ValueError, AttributeError):
            return None
    return Notice(seq, worker_id if seq is not None else None)


def add_local_listener(listener: Listener) -> None:
    with _lock:
        _listeners.append(listener)


def remove_local_listener(listener: Listener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


CHANGE_RETENTION = timedelta(minutes=10)  # the leader deletes older changes (a process further behind reloads)


def record_change(worker_id: str | UUID | None = None) -> int:
    """Count one committed registry change in the store (sync code, outside the caller's
    transaction); its sequence number."""
    return int(RegistryChange.objects.create(worker_id=worker_id).seq)


def latest_change() -> int:
    """The sequence number of the newest change (0 before the first). Every gateway process asks
    twice a second, idle or not: one statement written once (``MAX`` of the primary key, an index
    read) instead of a queryset built and compiled on every poll, most of an idle process's store
    work (D94)."""
    meta = RegistryChange._meta
    connection = connections[router.db_for_read(RegistryChange)]
    with connection.cursor() as cursor:
        quote = connection.ops.quote_name
        cursor.execute(f"SELECT MAX({quote('seq')}) FROM {quote(meta.db_table)}")  # the primary key's column
        row = cursor.fetchone()
    return int(row[0] or 0) if row else 0


def changes_since(seq: int, limit: int) -> list[tuple[int, str | None]]:
    """The changes after ``seq``, oldest first, at most ``limit``: (sequence number, worker id or None)."""
    rows = RegistryChange.objects.filter(seq__gt=seq).order_by("seq").values_list("seq", "worker_id")[:limit]
    return [(int(number), None if worker is None else str(worker)) for number, worker in rows]


def prune_changes(now: datetime | None = None) -> int:
    """Delete the changes older than CHANGE_RETENTION; how many went."""
    horizon = (now or timezone.now()) - CHANGE_RETENTION
    deleted, _ = RegistryChange.objects.filter(at__lt=horizon).delete()
    return deleted


def publish_registry_changed(worker_id: str | UUID | None = None) -> None:
    """Call from sync code (jobs, commands, views) after a committed change to ``worker_id`` (None:
    not one worker's change; every process then reloads the whole fleet)."""
    seq: int | None = None
    try:
        seq = record_change(worker_id)
        STORE.recovered()
    except STORE_ERRORS as exc:  # the store is down (logged once): listeners and the timer carry the change
        STORE.failed(exc)
    _tell([Notice(seq, None if worker_id is None else str(worker_id))])


def publish_registry_changes(worker_ids: Sequence[str | UUID]) -> None:
    """:func:`publish_registry_changed` for many workers changed together (a batch of
    registrations, health transitions made together): their change-log rows in one write, then each
    one's notice, as one change each would give."""
    if not worker_ids:
        return
    seqs: list[int | None] = [None] * len(worker_ids)
    try:
        rows = RegistryChange.objects.bulk_create([RegistryChange(worker_id=worker_id) for worker_id in worker_ids])
        seqs = [None if row.seq is None else int(row.seq) for row in rows]  # None: a store that does not return them
        STORE.recovered()
    except STORE_ERRORS as exc:  # as for one change: listeners and the timer carry them
        STORE.failed(exc)
    _tell([Notice(seq, str(worker_id)) for seq, worker_id in zip(seqs, worker_ids)])


def _tell(notices: Sequence[Notice]) -> None:
    """Hand these notices to this process's listeners and, with Redis, to the other processes."""
    with _lock:
        listeners = list(_listeners)
    for notice in notices:
        for listener in listeners:
            try:
                listener(notice)
            except Exception:
                log.exception("registry listener failed")
    if getattr(settings, "REDIS_URL", None):
        layer = get_channel_layer()
        if layer is not None:
            for notice in notices:
                _notify_over_redis(layer, notice)


def _notify_over_redis(layer: BaseChannelLayer, notice: Notice) -> None:
    """Tell the other processes at once. A pooled connection Redis dropped (it restarted) fails the
    first send and is replaced, so a failed send is tried once more before it counts as an outage;
    the store's change log carries the change either way."""
    from redis.exceptions import RedisError  # a gateway with REDIS_URL only (redis imports OpenTelemetry's SDK; D118)

    for attempt in (1, 2):
        try:
            async_to_sync(layer.group_send)(GROUP, notice_message(notice))
        except (RedisError, OSError) as exc:
            if attempt == 2:
                REDIS.failed(exc)
        except Exception:
            log.warning("could not publish the registry notice over the channel layer", exc_info=True)
            return
        else:
            REDIS.recovered()
            return
