"""'The worker registry changed': tell every gateway process to rebuild its snapshot.

Three paths, so a change reaches every process within about a second with or without Redis:

- the store: :class:`~administration.models.RegistryVersion` goes up by one, and every gateway
  process polls it (``registry_version``), wherever the change was made (API, console, command,
  Celery job, another gateway on the store);
- this process's own listeners are called directly;
- with Redis, the Channels layer group ``gateway.registry`` tells the others at once.

Each gateway also refreshes on a timer, so a lost notice delays a change but never loses it.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F

from administration.models import RegistryVersion

__all__ = [
    "GROUP", "publish_registry_changed", "bump_registry_version", "registry_version", "add_local_listener",
    "remove_local_listener",
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


_VERSION_ROW = 1


def bump_registry_version() -> None:
    """Count one committed registry change in the store (sync code; no transaction of the caller's
    is held open by it)."""
    if RegistryVersion.objects.filter(pk=_VERSION_ROW).update(version=F("version") + 1):
        return
    try:
        with transaction.atomic():
            RegistryVersion.objects.create(pk=_VERSION_ROW, version=1)
    except IntegrityError:  # another process made the row first
        RegistryVersion.objects.filter(pk=_VERSION_ROW).update(version=F("version") + 1)


def registry_version() -> int:
    """The store's registry version (0 before the first change)."""
    found = RegistryVersion.objects.filter(pk=_VERSION_ROW).values_list("version", flat=True).first()
    return int(found or 0)


def publish_registry_changed() -> None:
    """Call from sync code (jobs, commands, views) after a committed change."""
    try:
        bump_registry_version()
    except Exception:  # the store is down: the listeners and the timer still carry the change
        log.warning("could not count the registry change in the store", exc_info=True)
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
            try:
                async_to_sync(layer.group_send)(GROUP, {"type": "registry.changed"})
            except Exception:
                log.warning("could not publish the registry notice over the channel layer", exc_info=True)
