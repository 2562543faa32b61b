"""'The worker registry changed': tell every gateway process which workers to re-read.

The store is the record: every committed change adds a :class:`~administration.models.RegistryChange`
row naming the worker it touched (none for a change that is not one worker's, such as tenant
limits). Every gateway process reads the rows past the last one it applied twice a second
(``changes_since``) and re-reads only those workers, wherever the change was made (API, console,
command, Celery job, another gateway on the store). Two shortcuts make it sooner:

- this process's own listeners are called directly;
- with Redis, the Channels layer group ``gateway.registry`` tells the others at once.

Both only say "read the changes now". Each gateway also reloads the whole fleet on a slow timer, so
a lost change delays it but never loses it.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta
from typing import Callable
from uuid import UUID

from asgiref.sync import async_to_sync
from channels.layers import BaseChannelLayer, get_channel_layer
from django.conf import settings
from django.utils import timezone
from redis.exceptions import RedisError

from administration.db import STORE_ERRORS
from administration.models import RegistryChange
from common.outages import REDIS, STORE

__all__ = [
    "GROUP", "CHANGE_RETENTION", "publish_registry_changed", "record_change", "latest_change", "changes_since",
    "prune_changes", "add_local_listener", "remove_local_listener",
]

log = logging.getLogger(__name__)

GROUP = "gateway.registry"
_listeners: list[Callable[[], None]] = []
_lock = threading.Lock()


def add_local_listener(listener: Callable[[], None]) -> None:
    with _lock:
        _listeners.append(listener)


def remove_local_listener(listener: Callable[[], None]) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


CHANGE_RETENTION = timedelta(minutes=10)  # the leader deletes older changes (a process further behind reloads)


def record_change(worker_id: str | UUID | None = None) -> int:
    """Count one committed registry change in the store (sync code, outside the caller's
    transaction); its sequence number."""
    return int(RegistryChange.objects.create(worker_id=worker_id).seq)


def latest_change() -> int:
    """The sequence number of the newest change (0 before the first)."""
    found = RegistryChange.objects.order_by("-seq").values_list("seq", flat=True).first()
    return int(found or 0)


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
    try:
        record_change(worker_id)
        STORE.recovered()
    except STORE_ERRORS as exc:  # the store is down (logged once): listeners and the timer carry the change
        STORE.failed(exc)
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener()
        except Exception:
            log.exception("registry listener failed")
    if getattr(settings, "REDIS_URL", None):
        layer = get_channel_layer()
        if layer is not None:
            _notify_over_redis(layer)


def _notify_over_redis(layer: BaseChannelLayer) -> None:
    """Tell the other processes at once. A pooled connection Redis dropped (it restarted) fails the
    first send and is replaced, so a failed send is tried once more before it counts as an outage;
    the store's change log carries the change either way."""
    for attempt in (1, 2):
        try:
            async_to_sync(layer.group_send)(GROUP, {"type": "registry.changed"})
        except (RedisError, OSError) as exc:
            if attempt == 2:
                REDIS.failed(exc)
        except Exception:
            log.warning("could not publish the registry notice over the channel layer", exc_info=True)
            return
        else:
            REDIS.recovered()
            return
