"""Database work from async background code (fleet refreshes, health transitions).

Django connections are per thread and go back to the pool only when closed; a request closes its
own at the end, background work must do it itself. ``arun_db`` runs a sync ORM function on a worker
thread and closes that thread's connections afterwards, so nothing holds a pooled connection. The
embedded SQLite store has no pool: there closing would only make the next call open the file again
(half a millisecond, paid thousands of times while a large fleet registers), so its per-thread
connections stay open. Every call reports the store's state (:data:`common.outages.STORE`): the
background loops run every second or so, so they see an outage start and end.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connections

from common.outages import STORE

__all__ = ["arun_db", "STORE_ERRORS"]

T = TypeVar("T")

# What the store raises when it cannot be reached or dropped a connection (Postgres down, restarting,
# a cut network, no pooled connection in time): an outage, not a bug. Other database errors are bugs.
STORE_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)


def _closing(func: Callable[..., T], *args: Any) -> T:
    """Run ``func``, report the store's state to :data:`common.outages.STORE`, close connections."""
    try:
        result = func(*args)
    except STORE_ERRORS as exc:
        STORE.failed(exc)
        raise
    finally:
        if connections["default"].vendor != "sqlite":
            connections.close_all()
    STORE.recovered()
    return result


async def arun_db(func: Callable[..., T], *args: Any) -> T:
    return await sync_to_async(_closing, thread_sensitive=False)(func, *args)
