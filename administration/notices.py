"""'The worker registry changed': tell every gateway process to rebuild its snapshot.

Local listeners (this process's fleet) are called directly; other processes hear it over the
Channels layer group ``gateway.registry`` (Redis in deployment). Each gateway also refreshes on a
timer, so a lost notice delays a change but never loses it.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

__all__ = ["GROUP", "publish_registry_changed", "add_local_listener", "remove_local_listener"]

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


def publish_registry_changed() -> None:
    """Call from sync code (jobs, commands, views) after a committed change."""
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
